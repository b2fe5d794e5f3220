"""Step 5: the same DDP training, restarted by torchrun after a failure, resumed from a snapshot.

Run:  torchrun --standalone --nproc-per-node=2 --max-restarts=3 scripts/ddp_restart.py \
          --snapshot snapshot.pt --epochs 4 --batch-size 32
"""
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import common
from d2lpar import save_checkpoint
try:  # notebook 6's #@save cell, as you last ran it (d2lpar.save_cells wrote it)
    from restart_steps import load_snapshot
except ModuleNotFoundError:  # run outside the notebook: the package keeps the same cell
    from d2lpar.ddp import load_snapshot
try:  # notebook 5's #@save cells, as you last ran them (d2lpar.save_cells wrote them)
    from ddp_steps import init_process, make_loader, train_ddp
except ModuleNotFoundError:  # run outside the notebook: the package keeps the same cells
    from d2lpar.ddp import init_process, make_loader, train_ddp
from d2lpar.distributed import dist_env, emit_result, exit_now, gloo_threads, pick_backend


def main():
    """Run by each process torchrun starts; its rank comes from the environment."""
    args = common.get_args(__doc__)
    env = dist_env()  # RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE set by torchrun
    rank, world_size = env.rank, env.world_size
    attempt = int(os.environ.get('TORCHELASTIC_RESTART_COUNT', 0))  # 0, then 1 after a restart
    backend = pick_backend(env.local_world_size, args.backend)  # --backend, checked; or auto
    # The store torchrun's agent shares with its ranks outlives an attempt: this attempt's keys
    # get a prefix of their own, or a restarted rank may read an address a dead rank published
    # (pytorch/pytorch#135712: a restart read the previous attempt's NCCL id the same way).
    store = dist.TCPStore(env.master_addr, env.master_port, is_master=False)
    seen_before = store.check([f'joined/{attempt - 1}/{rank}']) if attempt else False
    store.set(f'joined/{attempt}/{rank}', 'yes')
    device = init_process(backend, rank, world_size, local_rank=env.local_rank,  # device first,
                          store=dist.PrefixStore(f'attempt{attempt}', store),  # then the group
                          timeout=args.timeout)
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
    # Every start, first or after a restart: continue from the snapshot if there is one.
    first_epoch = load_snapshot(args.snapshot, net.module, optimizer, map_location=device)
    print(f'rank {rank}, attempt {attempt}: starting at epoch {first_epoch + 1}', flush=True)

    def end_of_epoch(epoch, loss):
        if rank == 0:
            print(f'epoch {epoch + 1}/{args.epochs}: loss {loss:.4f}', flush=True)
        if attempt == 0 and rank == 0 and epoch == args.fail_at_epoch:
            print(f'rank 0: killed at the end of epoch {epoch + 1}', flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # as an out-of-memory kill or a lost node
        if rank == 0:  # one writer, atomically: a crash leaves the last complete snapshot
            save_checkpoint({'net': net.module.state_dict(), 'optimizer': optimizer.state_dict(),
                           'epoch': epoch}, args.snapshot)
        dist.barrier()  # no rank goes on before the snapshot is complete

    start = time.perf_counter()  # each epoch ends with loss.item(), which waits for the GPU
    losses = train_ddp(net, sampler, train_iter, optimizer, device, args.epochs, first_epoch,
                       end_of_epoch)
    step_seconds = (time.perf_counter() - start) / (args.epochs - first_epoch) / len(train_iter)
    final = common.flat_params(net.module)
    replicas = [torch.empty_like(final) for _ in range(world_size)]
    dist.all_gather(replicas, final)
    emit_result(rank=rank, world_size=world_size, init=init, synced=synced, final=final,
                losses=losses, step_seconds=step_seconds, shard=list(sampler), backend=backend,
                replica_gap=max((r - final).abs().max().item() for r in replicas),
                attempt=attempt, first_epoch=first_epoch,
                store_kept_last_attempt=seen_before)
    dist.destroy_process_group()
    emit_result(rank=rank, gloo_threads_after_destroy=gloo_threads())  # why exit_now, below
    exit_now()  # DDP keeps gloo's threads alive, and Python's own teardown can abort on them


if __name__ == '__main__':
    main()
