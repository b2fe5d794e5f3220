"""Two classic hangs, made to fail with a message: mismatched collectives, a rank that is late.

Run:  TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc-per-node=2 \
          scripts/debug_dist.py --late-rank 1 --barrier-timeout 1

With TORCH_DISTRIBUTED_DEBUG=DETAIL, the ranks' all_reduce of tensors of different lengths
fails on every rank with the shapes each rank used; then dist.monitored_barrier names the rank
that did not arrive in time (gloo only).
"""
import argparse
import datetime
import time

import torch
import torch.distributed as dist

from d2lpar.distributed import default_timeout, dist_env, emit_result, exit_now


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--late-rank', type=int, default=1, help='this rank misses the barrier')
    parser.add_argument('--barrier-timeout', type=float, default=2.0, help='seconds')
    args = parser.parse_args()
    env = dist_env()
    dist.init_process_group('gloo', rank=env.rank, world_size=env.world_size,
                            timeout=default_timeout())  # monitored_barrier needs gloo
    x = torch.zeros(3 + env.rank)  # a bug: ranks disagree on the length
    try:
        dist.all_reduce(x)
        mismatch = None
    except RuntimeError as e:
        mismatch = str(e)
    if env.rank == args.late_rank:  # stuck somewhere else: a slow data loader, a loop
        time.sleep(args.barrier_timeout + 1)
        barrier = None
    else:
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=args.barrier_timeout))
            barrier = None
        except RuntimeError as e:
            barrier = str(e)
    print(f'rank {env.rank}: mismatch {"caught" if mismatch else "not caught"}, '
          f'barrier {"failed" if barrier else "passed or skipped"}', flush=True)
    emit_result(rank=env.rank, mismatch=mismatch, barrier=barrier)
    # No destroy_process_group: after the failed barrier the ranks are out of step, and
    # tearing the group down would wait for each other. Leave at once instead.
    exit_now()


if __name__ == '__main__':
    main()
