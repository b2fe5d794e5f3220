"""DDP training in one file that imports only torch: copy it into your project and adapt it.

Run:  torchrun --standalone --nproc-per-node=2 ddp_standalone.py --epochs 3 --ckpt ckpt.pt
(one GPU per process: NCCL; otherwise gloo on the CPU. Run it again to resume from --ckpt.)
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--batch-size', type=int, default=32, help='per process')
    parser.add_argument('--ckpt', default='ckpt.pt')
    args = parser.parse_args()
    local_rank, local_world = int(os.environ['LOCAL_RANK']), int(os.environ['LOCAL_WORLD_SIZE'])
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world:  # usable GPUs
        device = torch.device('cuda', local_rank)
        torch.cuda.set_device(device)  # before the group: NCCL and new tensors use this GPU
        dist.init_process_group('nccl', device_id=device)  # reads the rest from torchrun
    else:
        device = torch.device('cpu')
        dist.init_process_group('gloo')
    rank, world_size = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)  # the same data set in every process
    X = torch.randn(2048, 16, generator=g)
    dataset = TensorDataset(X, (X[:, :4].sum(1) > 0).long())
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)  # this rank's shard
    loader = DataLoader(dataset, args.batch_size, sampler=sampler, drop_last=True)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
    net = DDP(net, device_ids=[local_rank] if device.type == 'cuda' else None)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    first_epoch = 0
    if os.path.exists(args.ckpt):  # resume; map_location: onto this rank's device, not GPU 0
        state = torch.load(args.ckpt, map_location=device, weights_only=True)
        net.module.load_state_dict(state['net'])
        optimizer.load_state_dict(state['optimizer'])
        first_epoch = state['epoch'] + 1
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)  # without it every epoch repeats the same order
        total = torch.zeros(2, device=device)
        for Xb, yb in loader:
            Xb, yb = Xb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(net(Xb), yb)
            loss.backward()  # DDP averages the gradients of all ranks here
            optimizer.step()
            total += torch.stack([loss.detach(), torch.ones((), device=device)])
        dist.all_reduce(total)  # the mean loss over all ranks, only to print it
        if rank == 0:  # one writer; net.module: keys without 'module.'; atomic via os.replace
            print(f'epoch {epoch}: loss {(total[0] / total[1]).item():.4f} ({world_size} '
                  f'processes, {dist.get_backend()})', flush=True)  # flush: a pipe buffers
            torch.save({'net': net.module.state_dict(), 'optimizer': optimizer.state_dict(),
                        'epoch': epoch}, args.ckpt + '.tmp')
            os.replace(args.ckpt + '.tmp', args.ckpt)  # a crash leaves the old file or the new
        dist.barrier()  # no rank goes on (or reads the checkpoint) before it is complete
    dist.destroy_process_group()


if __name__ == '__main__':  # spawn and forkserver children import this file: do not train then
    main()
    # gloo (torch 2.14+) may abort a finished rank at shutdown: flush, exit now (no atexit).
    sys.stdout.flush(), sys.stderr.flush(), os._exit(0)
