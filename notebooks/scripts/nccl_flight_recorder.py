"""NCCL's flight recorder on a real hang: one rank skips a collective (needs 2 GPUs).

Run:  python scripts/nccl_flight_recorder.py --dump-dir fr_dumps

Starts 2 ranks under torchrun with the flight recorder on (TORCH_NCCL_TRACE_BUFFER_SIZE).
Both ranks join one all_reduce; then rank 1 skips the second (the classic bug: a collective
inside `if rank == 0:`) and is busy elsewhere, so rank 0 waits. After the group's timeout
NCCL's watchdog writes the ranks' recent collectives to DIR/nccl_trace_rank_<rank>
(TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_FR_DUMP_TEMP_FILE) and stops the job. This script then
shows what each dump says and runs torch's reader on them:

    python -m torch.distributed.flight_recorder.fr_trace DIR

Exit status 0 when rank 0's dump shows its last all_reduce never completed.
"""
import argparse
import datetime
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

PREFIX = 'nccl_trace_rank_'


def worker(timeout):
    """One rank: a collective both ranks join, then one only rank 0 joins."""
    local_rank = int(os.environ['LOCAL_RANK'])
    torch.cuda.set_device(local_rank)
    dist.init_process_group('nccl', device_id=torch.device('cuda', local_rank),
                            timeout=datetime.timedelta(seconds=timeout))
    x = torch.ones(1024, device='cuda')
    dist.all_reduce(x)  # both ranks: recorded as completed
    torch.cuda.synchronize()
    if dist.get_rank() == 0:
        dist.all_reduce(x)  # the bug: rank 1 never calls this one
        torch.cuda.synchronize()  # waits until the watchdog gives up
    else:
        time.sleep(6 * timeout)  # stuck elsewhere, but alive: its watchdog can still dump


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--dump-dir', type=Path, default=Path('fr_dumps'))
    parser.add_argument('--timeout', type=int, default=20, help="the group's timeout, seconds")
    parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.timeout)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0  # usable ones only
    if gpus < 2:
        sys.exit('nccl_flight_recorder.py: needs 2 GPUs (NCCL gives each rank its own); '
                 f'CUDA can use {gpus} here')
    args.dump_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TORCH_NCCL_TRACE_BUFFER_SIZE='2000', TORCH_NCCL_DUMP_ON_TIMEOUT='1',
               TORCH_FR_DUMP_TEMP_FILE=str(args.dump_dir.resolve() / PREFIX))
    job = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                          '--nproc-per-node=2', __file__, '--worker', '--timeout',
                          str(args.timeout)], env=env, timeout=20 * args.timeout)
    print(f'the job stopped with exit status {job.returncode} (a timeout, as planned)')
    dumps = sorted(args.dump_dir.glob(PREFIX + '*'))
    last = {}
    for path in dumps:
        with open(path, 'rb') as f:
            entries = pickle.load(f).get('entries', [])
        rank = int(path.name[len(PREFIX):])
        last[rank] = entries[-1] if entries else {}
        print(f'rank {rank}: ' + ', '.join(f"{e.get('profiling_name')} {e.get('state')}"
                                            for e in entries))
    reader = [sys.executable, '-m', 'torch.distributed.flight_recorder.fr_trace',
              str(args.dump_dir), '--prefix', PREFIX]
    if len(dumps) < 2:
        reader.append('--allow-incomplete-ranks')
    print('$', ' '.join(reader[1:]), flush=True)
    subprocess.run(reader)
    stuck = last.get(0, {})
    if 'all_reduce' not in str(stuck.get('profiling_name')) or stuck.get('state') == 'completed':
        sys.exit(f'expected rank 0 stuck in all_reduce; its dump says {stuck or "nothing"}')
    print("rank 0's last collective, an all_reduce, never completed: the flight recorder says "
          'where it hung')


if __name__ == '__main__':
    main()
