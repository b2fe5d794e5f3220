"""Start N copies of a script the way SLURM's srun does: SLURM_* variables, no RANK.

Run:  python tests/scripts/fake_srun.py --ntasks 2 --nodelist 'localhost,node[2-3]' \
          notebooks/scripts/ddp_multinode.py --epochs 1
MASTER_ADDR is removed, so the tasks must find it in the node list; MASTER_PORT is kept.
"""
import argparse
import os
import signal
import subprocess
import sys
import time

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument('--ntasks', type=int, default=2)
parser.add_argument('--nodelist', default='localhost')
parser.add_argument('script')
parser.add_argument('args', nargs=argparse.REMAINDER)
opts = parser.parse_args()

tasks = []
for procid in range(opts.ntasks):  # one node: local ids equal global ids
    env = {k: v for k, v in os.environ.items() if k not in ('MASTER_ADDR', 'RANK', 'WORLD_SIZE')}
    env.update(SLURM_PROCID=str(procid), SLURM_NTASKS=str(opts.ntasks),
               SLURM_LOCALID=str(procid), SLURM_NODEID='0', SLURM_NODELIST=opts.nodelist,
               SLURM_TASKS_PER_NODE=str(opts.ntasks), SLURM_JOB_ID='4242')
    tasks.append(subprocess.Popen([sys.executable, opts.script, *opts.args], env=env))


def stop(signum, frame):
    for task in tasks:
        task.terminate()
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, stop)
codes = {}
while len(codes) < len(tasks):  # like srun: the first failure ends the step
    for i, task in enumerate(tasks):
        if i not in codes and task.poll() is not None:
            codes[i] = task.returncode
            if task.returncode:
                for other in tasks:
                    if other.poll() is None:
                        other.terminate()
    time.sleep(0.05)
sys.exit(next((c for c in codes.values() if c), 0))
