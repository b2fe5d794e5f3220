"""Time the naive, ring and built-in allreduce over a range of message sizes.

Run:  torchrun --standalone --nproc-per-node=4 scripts/collectives_timing.py \
          --sizes 4096 1048576 --repeats 5
Rank 0 hands back one record per (method, size): the best of `repeats`
measurements, each the slowest rank's time (see d2lpar.collectives.allreduce_timings).
"""
import argparse

import torch.distributed as dist

from d2lpar.collectives import allreduce_timings, bandwidths
from d2lpar.distributed import default_timeout, emit_result

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument('--sizes', type=int, nargs='+', required=True, help='message sizes in bytes')
parser.add_argument('--repeats', type=int, default=5)
args = parser.parse_args()

dist.init_process_group('gloo', timeout=default_timeout())
n = dist.get_world_size()
timings = []
for size in args.sizes:  # one size at a time, so that progress shows
    records = allreduce_timings([size], repeats=args.repeats)
    for record in records:
        record['algbw'], record['busbw'] = bandwidths(size, record['seconds'], n)
    timings += records
    if dist.get_rank() == 0:
        print(f'{size / 2**10:8.0f} KB: ' + ', '.join(
            f'{r["method"]} {r["seconds"] * 1e3:.2f} ms' for r in records), flush=True)
if dist.get_rank() == 0:
    emit_result(world_size=n, timings=timings)
dist.destroy_process_group()
