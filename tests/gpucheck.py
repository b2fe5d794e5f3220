"""Verify the course on a machine with GPUs, in one command, without editing any file.

    make gpucheck                                    # every row this machine can run
    make gpucheck GPUCHECK_FLAGS="--rows 05,nccl"    # rows whose name contains 05 or nccl
    python tests/gpucheck.py --list                  # the rows, and how many GPUs each needs

Each row is one check: a notebook executed at full size in its folder (as a learner runs
it, D2LPAR_SMALL=0), or a GPU-only run that no notebook makes on every machine (NCCL, float16
with GradScaler, compression hooks, inductor, FSDP2, tensor and pipeline parallelism,
restarts). A row that needs more GPUs than CUDA can use here is marked
`SKIPPED (needs N GPUs)`, so on a laptop the command runs what it can, and one GPU runs every
row that does not need two. The end is one table (row, result, seconds) under the machine's
GPU facts; each row's output goes to build/gpucheck/ROW.log. Exit status 1 when a row failed.
Every row together takes about 30 minutes on two GPUs; `--rows` runs it in parts.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
SCRIPTS = NOTEBOOKS / 'scripts'


@dataclass
class Row:
    """One check: `notebook` executed at full size, or `argv` run from notebooks/."""
    name: str
    needs: int = 0  # GPUs that CUDA must be able to use
    notebook: Path = None
    argv: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    timeout: int = 1800  # seconds for the whole row


def _python(*args):
    return [sys.executable, *map(str, args)]


def _torchrun(nproc, script, *args):
    return _python('-m', 'torch.distributed.run', '--standalone', f'--nproc-per-node={nproc}',
                   SCRIPTS / script, *args)


def rows(scratch):
    """Return every row, notebooks first, in course order; `scratch` holds per-row files."""
    table = [Row(f'notebook {p.stem}', notebook=p)
             for p in sorted(NOTEBOOKS.glob('[0-9][0-9]_*.ipynb'))]
    table += [
        Row('nccl ddp: torchrun, 2 processes, one GPU each', 2,
            argv=_torchrun(2, 'ddp_torchrun.py', '--backend', 'nccl', '--epochs', '4')),
        Row('nccl ddp: mp.spawn, 2 processes', 2,
            argv=_python(SCRIPTS / 'ddp_spawn.py', '--nproc', '2', '--backend', 'nccl')),
        Row('nccl hello with NCCL_DEBUG=INFO', 2, env={'NCCL_DEBUG': 'INFO'},
            argv=_torchrun(2, 'hello_dist.py', '--backend', 'nccl')),
        Row('nccl SyncBatchNorm and DDP arguments (ddp_anatomy)', 2,
            argv=_torchrun(2, 'ddp_anatomy.py', '--backend', 'nccl')),
        Row('nccl fp16 GradScaler, fp16 compression hook, inductor compile, profiler', 2,
            argv=_torchrun(2, 'ddp_practice.py', '--backend', 'nccl', '--parts', 'all',
                           '--trace-dir', scratch / 'trace', '--compile-backend', 'inductor')),
        Row('nccl restart: a rank fails, resumed from a fresh snapshot', 2,
            argv=_python('-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2',
                         '--max-restarts=1', SCRIPTS / 'ddp_restart.py', '--backend', 'nccl',
                         '--snapshot', scratch / 'snapshot.pt', '--fail-at-epoch', '1')),
        Row('nccl standalone DDP script (imports only torch)', 2,
            argv=_torchrun(2, 'ddp_standalone.py', '--epochs', '3', '--ckpt', scratch / 's.pt')),
        Row('nccl mini-DDP (hooks, buckets, overlap)', 2, env={'PYTHONPATH': str(ROOT)},
            argv=_torchrun(2, 'collectives_miniddp.py', '--variant', 'hook', 'buckets',
                           'overlap', '--buckets', '0.25', 'inf', '--check-steps', '3',
                           '--time-steps', '10')),
        Row('nccl context_parallel against full attention', 2,
            argv=_torchrun(2, 'context_parallel_torch.py')),
        Row('pytest: the tests that need two GPUs', 2,
            argv=_python('-m', 'pytest', '-q', '-p', 'no:xdist', '-rs',
                         ROOT / 'tests/test_dataparallel.py', ROOT / 'tests/test_pipeline.py',
                         '-k', 'on_gpus or two_gpus')),
        Row('mask: notebook 02 under CUDA_VISIBLE_DEVICES=1,0', 2,
            notebook=NOTEBOOKS / '02_visible_devices.ipynb', env={'CUDA_VISIBLE_DEVICES': '1,0'}),
        Row('one GPU visible: notebook 05 under CUDA_VISIBLE_DEVICES=0', 1,
            notebook=NOTEBOOKS / '05_ddp.ipynb', env={'CUDA_VISIBLE_DEVICES': '0'}),
    ]
    return table


def gpu_facts():
    """Return lines describing the GPUs, the driver and the torch, CUDA and NCCL builds."""
    import torch
    import d2lpar
    lines = [f'torch {torch.__version__}, CUDA {torch.version.cuda or "none"}, '
             f'NCCL {".".join(map(str, torch.cuda.nccl.version())) if d2lpar.num_gpus() else "-"}']
    for i in range(d2lpar.num_gpus()):
        props = torch.cuda.get_device_properties(i)
        lines.append(f'cuda:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB')
    try:
        driver = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                                capture_output=True, text=True, timeout=60).stdout.split()
        lines.append(f'driver {driver[0]}' if driver else 'driver: nvidia-smi listed no GPU')
    except (OSError, subprocess.TimeoutExpired):
        lines.append('driver: nvidia-smi not found')
    problem = d2lpar.gpu_problem()
    lines.append(f'GPUs CUDA can use: {d2lpar.num_gpus()}' + (f' ({problem})' if problem else ''))
    return lines


def _end(proc):
    """End `proc`'s session: SIGTERM first (torchrun then stops its workers), then SIGKILL."""
    from d2lpar.processes import end_processes, launched_processes
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    end_processes(launched_processes())  # ranks of a d2lpar.launch inside a notebook row


def run_row(row, log):
    """Run one row, writing its output to `log`; return (ok, seconds, note)."""
    env = dict(os.environ, **row.env)
    env.pop('D2LPAR_SMALL', None)  # full size, as a learner runs it
    start = time.perf_counter()
    if row.notebook is not None:
        # A child process, so that a row's CUDA_VISIBLE_DEVICES applies before CUDA starts.
        code = ('import sys; from d2lpar.render import execute_notebook; '
                'nb, setup, s, error = execute_notebook(sys.argv[1], timeout=int(sys.argv[2])); '
                'print(setup); print(error or "ok"); sys.exit(1 if error else 0)')
        argv = _python('-c', code, row.notebook, row.timeout)
    else:
        argv = row.argv
    with open(log, 'w') as out:
        # In a session of its own, so that a timeout or Ctrl-C ends the row's whole tree.
        proc = subprocess.Popen(argv, cwd=NOTEBOOKS, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=row.timeout)
            ok, note = proc.returncode == 0, f'exit {proc.returncode}'
        except subprocess.TimeoutExpired:
            ok, note = False, f'timed out after {row.timeout} s'
        finally:
            _end(proc)
    seconds = time.perf_counter() - start
    if not ok:
        tail = log.read_text(errors='replace').strip().splitlines()[-1:] or ['']
        note = f'{note}: {tail[0][:100]}'
    return ok, seconds, note


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rows', default='', help='comma-separated parts of row names to run')
    parser.add_argument('--list', action='store_true', help='list the rows and exit')
    parser.add_argument('--logs', default=str(ROOT / 'build' / 'gpucheck'),
                        help='folder for each row\'s output (default build/gpucheck)')
    args = parser.parse_args(argv)
    import d2lpar
    # Files rows write (snapshots) go to a fresh folder, removed at the end: every run
    # starts from nothing, so a restart row really restarts.
    scratch = Path(tempfile.gettempdir()) / f'd2lpar-gpucheck-{os.getpid()}'
    table = rows(scratch)
    wanted = [w.strip() for w in args.rows.split(',') if w.strip()]
    if wanted:
        table = [r for r in table if any(w in r.name for w in wanted)]
        if not table:
            parser.error(f'--rows {args.rows!r} matches no row; see --list')
    if args.list:
        for row in table:
            print(f'{row.needs} GPU(s)  {row.name}')
        return 0
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    scratch.mkdir()
    gpus = d2lpar.num_gpus()
    results = []
    try:
        for k, row in enumerate(table):
            if row.needs > gpus:
                results.append((row.name, f'SKIPPED (needs {row.needs} GPUs)', None))
                continue
            print(f'[{k + 1}/{len(table)}] {row.name} ...', flush=True)
            log = logs / (''.join(c if c.isalnum() else '_' for c in row.name)[:60] + '.log')
            ok, seconds, note = run_row(row, log)
            results.append((row.name, 'PASS' if ok else f'FAIL ({note}; see {log})', seconds))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print('\n' + '\n'.join(gpu_facts()) + '\n')
    width = max(len(name) for name, _, _ in results)
    for name, result, seconds in results:
        print(f'{name:{width}}  {"" if seconds is None else f"{seconds:6.0f} s"}  {result}')
    failed = sum(r.startswith('FAIL') for _, r, _ in results)
    ran = sum(s is not None for _, _, s in results)
    print(f'\n{ran - failed} passed, {failed} failed, {len(results) - ran} skipped')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
