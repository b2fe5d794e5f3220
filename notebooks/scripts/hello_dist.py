"""The smallest distributed program: the ranks add up their numbers with all_reduce.

Run:  torchrun --standalone --nproc-per-node=2 scripts/hello_dist.py
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from d2lpar.distributed import (BACKENDS, default_timeout, dist_env, emit_result, pick_backend,
                                rank_device)


@record  # a rank that raises writes its traceback where torchrun reports the root cause
def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--local-rank', '--local_rank', type=int, default=None,
                        help='set by the deprecated torch.distributed.launch, not by torchrun')
    parser.add_argument('--absent-rank', type=int, default=None,
                        help='this rank never joins (to watch the others time out)')
    parser.add_argument('--backend', choices=BACKENDS, default=None,
                        help='default: nccl when every process has a GPU of its own, else gloo')
    parser.add_argument('--timeout', type=float, default=None,
                        help='seconds to wait for the others, at start-up and in every collective')
    args = parser.parse_args()
    env = dist_env()
    if env.rank == args.absent_rank:
        print('not joining the group: sleeping instead', flush=True)
        time.sleep(3600)
    backend = pick_backend(env.local_world_size, args.backend)
    # Bind this process to its device first (device_id too): NCCL then sets up on this GPU.
    device = rank_device(backend, env.local_rank)
    dist.init_process_group(backend, init_method='env://', rank=env.rank,
                            world_size=env.world_size, timeout=default_timeout(args.timeout),
                            device_id=device if device.type == 'cuda' else None)
    x = torch.tensor([env.rank + 1.0], device=device)
    dist.all_reduce(x)  # every rank ends with 1 + 2 + ... + world_size
    print(f'rank {env.rank} of {env.world_size} ({backend}): all_reduce gave {x.item():g}',
          flush=True)
    emit_result(rank=env.rank, world_size=env.world_size, total=x.item(), argv=sys.argv[1:],
                local_rank_arg=args.local_rank, local_rank_env=os.environ.get('LOCAL_RANK'))
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
