"""A tiny worker for tests/test_launch.py and test_launch_cleanup.py that behaves as --mode says.

Run:  torchrun --nproc-per-node=2 tests/scripts/launch_probe.py --mode ok
Only 'ok' and 'dist' import torch (through d2lpar); the others start fast.
"""

import argparse
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument(
    '--mode', choices=['ok', 'quick', 'crash', 'hang', 'stubborn', 'dist', 'cprint', 'listen', 'restart'], default='ok'
)
parser.add_argument('--crash-rank', type=int, default=1, help="the rank that crashes in 'crash'")
parser.add_argument('--local-rank', '--local_rank', type=int, default=None)
args = parser.parse_args()
rank = int(os.environ.get('RANK', 0))
print(f'hello from rank {rank} pid {os.getpid()} argv {sys.argv[1:]}', flush=True)
if args.mode == 'ok':
    from d2lpar.distributed import emit_result

    cmdlines = {}  # this rank's command line and its parent's (torchrun), where /proc has them
    for who, pid in (('rank', os.getpid()), ('parent', os.getppid())):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                cmdlines[who] = [w.decode() for w in f.read().split(b'\0')[:-1]]
        except OSError:
            pass
    emit_result(
        pid=os.getpid(),
        argv=sys.argv[1:],
        local_rank_env=os.environ.get('LOCAL_RANK'),
        world_size=int(os.environ.get('WORLD_SIZE', 1)),
        cmdlines=cmdlines,
        environ=dict(os.environ),
    )
elif args.mode == 'crash':
    if rank == args.crash_rank:
        time.sleep(0.5)
        print('rank about to crash', flush=True)
        raise SystemExit(3)
    print('waiting for the others', flush=True)
    time.sleep(300)
elif args.mode == 'restart':  # rank 1 fails on the first attempt only; torchrun restarts all
    attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])
    print(f'attempt {attempt}', flush=True)
    if attempt == 0:
        if rank == 1:
            time.sleep(0.5)
            raise SystemExit(3)
        time.sleep(300)  # torchrun stops this rank when rank 1 fails, then restarts both
    from d2lpar.distributed import emit_result

    emit_result(attempt=attempt, pid=os.getpid())
elif args.mode == 'cprint':  # C stdio into a file is fully buffered: only a flush shows this
    import ctypes

    libc = ctypes.CDLL(None)
    if sys.platform.startswith('linux'):  # as without `python -u` (mp.spawn's children): buffered
        c_buffer = ctypes.create_string_buffer(1 << 16)  # glibc keeps -u's 1-byte one otherwise
        libc.setvbuf(ctypes.c_void_p.in_dll(libc, 'stdout'), c_buffer, 0, len(c_buffer))  # _IOFBF
    libc.printf(f'printed by C in rank {rank}\n'.encode())
    if rank == 1:
        time.sleep(0.5)
        raise SystemExit(3)
    time.sleep(300)
elif args.mode in ('hang', 'stubborn'):
    if args.mode == 'stubborn':  # ignores SIGTERM, so only SIGKILL ends it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print('sleeping', flush=True)
    time.sleep(300)
elif args.mode == 'listen':  # hold the store and gloo's sockets open for a while
    import torch
    import torch.distributed as dist
    from d2lpar.distributed import default_timeout

    dist.init_process_group('gloo', timeout=default_timeout())
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f'joined: all_reduce gave {t.item():g}', flush=True)
    time.sleep(2.5)  # long enough for the test to sample the listening sockets many times
    dist.barrier()
    dist.destroy_process_group()
elif args.mode == 'dist':
    import torch
    import torch.distributed as dist
    from d2lpar.distributed import default_timeout, emit_result

    dist.init_process_group('gloo', timeout=default_timeout())
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    emit_result(total=t.item())
    dist.destroy_process_group()
