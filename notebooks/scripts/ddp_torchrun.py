"""Step 3: the same DDP training, with the processes started by torchrun.

Run:  torchrun --standalone --nproc-per-node=2 scripts/ddp_torchrun.py --epochs 4 --batch-size 32
"""

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import common
try:  # notebook 5's #@save cells, as you last ran them (d2lpar.save_cells wrote them)
    from ddp_steps import init_process, make_loader, train_ddp
except ModuleNotFoundError:  # run outside the notebook: the package keeps the same cells
    from d2lpar.ddp import init_process, make_loader, train_ddp
from d2lpar.distributed import dist_env, emit_result, exit_now, pick_backend


def main():
    """Run by each process torchrun starts; its rank comes from the environment."""
    args = common.get_args(__doc__)
    env = dist_env()  # RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE set by torchrun
    rank, world_size = env.rank, env.world_size
    backend = pick_backend(env.local_world_size, args.backend)  # --backend, checked; or auto
    device = init_process(backend, rank, world_size, local_rank=env.local_rank,  # device first,
                          init_method='env://', timeout=args.timeout)  # then the group
    torch.manual_seed(args.seed + rank)  # replicas start different on purpose...
    net = common.make_net().to(device)
    init = common.flat_params(net)
    on_gpu = device.type == 'cuda'
    net = DDP(net, device_ids=[device.index] if on_gpu else None,  # ...DDP copies rank 0's
              output_device=device.index if on_gpu else None,
              find_unused_parameters=False)  # True only if forward skips some parameters
    synced = common.flat_params(net.module)
    dataset = common.make_dataset(args.num_samples, args.seed)
    sampler, train_iter = make_loader(
        dataset, common.local_batch_size(args.batch_size, world_size), world_size, rank,
        args.seed)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    first_epoch = 0
    if args.resume:  # every rank reads the file, onto its own device
        first_epoch = common.load_checkpoint(args.ckpt, net.module, optimizer,
                                             map_location=device)

    def end_of_epoch(epoch, loss):
        if rank == 0:
            print(f'epoch {epoch + 1}/{args.epochs}: loss {loss:.4f}', flush=True)
        if args.ckpt:
            if rank == 0:  # one writer; net.module, so the keys have no 'module.' prefix
                common.save_checkpoint(args.ckpt, net.module, optimizer, epoch)
            dist.barrier()  # no rank goes on before the checkpoint is complete

    start = time.perf_counter()  # each epoch ends with loss.item(), which waits for the GPU
    losses = train_ddp(net, sampler, train_iter, optimizer, device, args.epochs, first_epoch,
                       end_of_epoch)
    step_seconds = (time.perf_counter() - start) / (args.epochs - first_epoch) / len(train_iter)
    final = common.flat_params(net.module)
    replicas = [torch.empty_like(final) for _ in range(world_size)]
    dist.all_gather(replicas, final)
    emit_result(rank=rank, world_size=world_size, init=init, synced=synced, final=final,
                losses=losses, step_seconds=step_seconds, shard=list(sampler), backend=backend,
                replica_gap=max((r - final).abs().max().item() for r in replicas))
    dist.destroy_process_group()
    exit_now()  # DDP keeps gloo's threads alive, and Python's own teardown can abort on them


if __name__ == '__main__':
    main()
