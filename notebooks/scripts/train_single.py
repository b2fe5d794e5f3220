"""Step 1: train in one process. The reference the distributed scripts must reproduce.

Run:  python scripts/train_single.py --epochs 4 --batch-size 32
"""
import time

import torch

import common
from d2lpar import try_gpu
try:  # notebook 5's #@save cells, as you last ran them (d2lpar.save_cells wrote them)
    from ddp_steps import make_loader, train_ddp
except ModuleNotFoundError:  # run outside the notebook: the package keeps the same cells
    from d2lpar.ddp import make_loader, train_ddp
from d2lpar.distributed import emit_result


def main():
    args = common.get_args(__doc__)
    rank, world_size = 0, 1
    device = try_gpu()
    torch.manual_seed(args.seed + rank)
    net = common.make_net().to(device)
    init = common.flat_params(net)
    dataset = common.make_dataset(args.num_samples, args.seed)
    sampler, train_iter = make_loader(
        dataset, common.local_batch_size(args.batch_size, world_size), world_size, rank,
        args.seed)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    first_epoch = 0
    if args.resume:
        first_epoch = common.load_checkpoint(args.ckpt, net, optimizer, map_location=device)

    def end_of_epoch(epoch, loss):
        print(f'epoch {epoch + 1}/{args.epochs}: loss {loss:.4f}', flush=True)
        if args.ckpt:
            common.save_checkpoint(args.ckpt, net, optimizer, epoch)

    start = time.perf_counter()  # each epoch ends with loss.item(), which waits for the GPU
    losses = train_ddp(net, sampler, train_iter, optimizer, device, args.epochs, first_epoch,
                       end_of_epoch)
    step_seconds = (time.perf_counter() - start) / (args.epochs - first_epoch) / len(train_iter)
    final = common.flat_params(net)
    emit_result(rank=rank, world_size=world_size, init=init, synced=init, final=final,
                losses=losses, step_seconds=step_seconds, shard=list(sampler))


if __name__ == '__main__':
    main()
