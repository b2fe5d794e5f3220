"""Verify the course on a machine with GPUs, in one command, without editing any file.

    make gpucheck                                    # every row this machine can run
    make gpucheck GPUCHECK_FLAGS=--quick             # what one GPU can prove, in minutes
    make gpucheck GPUCHECK_FLAGS="--rows 05,nccl"    # rows whose name contains 05 or nccl
    python verify/gpucheck.py --list                 # the rows, and how many GPUs each needs

Each row is one check: a notebook executed in its folder (at full size, as a learner runs
it, or at the small workload in the quick rows), or a GPU-only run that no notebook makes on
every machine (NCCL, float16 with GradScaler, compression hooks, inductor, FSDP2, tensor and
pipeline parallelism, restarts, the flight recorder). A GPU-only row passes only when what
its ranks report is what the notebook asserts (its check function), not merely when it
exits 0. A row that needs more GPUs than CUDA can use here is marked `SKIPPED (needs N GPUs)`.

Before any row, gpucheck asks the driver how many GPUs it has (nvidia-smi, /proc/driver/
nvidia): when the driver lists GPUs that torch cannot use (most often a torch built for a
newer CUDA than the driver), it stops with the reason and the fix (exit status 2); on a
machine with no GPU at all it stops too (exit status 3: it would verify no GPU path), unless
--allow-cpu. Each row's verdict and seconds print as the row finishes (and go to
build/gpucheck/summary.tsv), its output to build/gpucheck/ROW.log; the end is one table
under the machine's GPU facts. Exit status 1 when a row failed. Notebooks run offline
(D2LPAR_OFFLINE=1, the stand-in data) unless --online.

A script that a notebook writes with `%%writefile {work}/NAME.py` (notebooks 10-14) is run
by a row of its own, which is also a command:

    python verify/gpucheck.py script notebooks/13_tensor_parallel_dtensor.ipynb tp_mfu.py \
        --nproc 2 --backend nccl --device cuda -- --steps 20

It runs the notebook's first code cell, its `#@save` cells and that `%%writefile` cell in a
kernel (nothing else: the rest is the notebook row's to check), with TMPDIR in a scratch
folder so that the notebook's work folder lands there; launches the script written there with
torchrun (PYTHONPATH work:ROOT, as the notebook's launch has it); and checks what the ranks
handed back with the facts the notebook asserts after its own launch.
"""

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The pieces, one idea each (verify/gpu/__init__.py lists them); main looks rows and driver_gpus
# up here, so that a test can stand in for them.
from verify.gpu import PORT  # noqa: E402,F401
from verify.gpu.machine import driver_gpus, gpu_facts, preflight  # noqa: E402
from verify.gpu.rows import Row, rows  # noqa: E402,F401
from verify.gpu.running import _end, run_row  # noqa: E402,F401
from verify.gpu.scripts import run_script  # noqa: E402


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ['script']:
        return run_script(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rows', default='', help='comma-separated parts of row names to run')
    parser.add_argument(
        '--quick',
        action='store_true',
        help='only the rows one GPU can prove, in minutes (their names start '
        'with "quick"; --list --quick shows each one\'s estimated seconds)',
    )
    parser.add_argument(
        '--budget', type=float, default=None, help='start no row after this many seconds (default 480 with --quick)'
    )
    parser.add_argument('--list', action='store_true', help='list the rows and exit')
    parser.add_argument(
        '--allow-cpu',
        action='store_true',
        help='on a machine with no GPU, run the rows a CPU can (verifies no '
        'GPU path) instead of stopping with exit status 3',
    )
    parser.add_argument(
        '--online', action='store_true', help='let notebooks download Fashion-MNIST (default: offline stand-in)'
    )
    parser.add_argument(
        '--logs',
        default=str(ROOT / 'build' / 'gpucheck'),
        help='folder for each row\'s output, the traces and summary.tsv (default build/gpucheck)',
    )
    args = parser.parse_args(argv)
    if args.budget is None and args.quick:
        args.budget = 480
    logs = Path(args.logs).resolve()
    # Files rows write (snapshots) go to a fresh folder, removed at the end: every run
    # starts from nothing, so a restart row really restarts. Traces stay under --logs.
    scratch = Path(tempfile.gettempdir()) / f'd2lpar-gpucheck-{os.getpid()}'
    table = [r for r in rows(scratch) if r.quick == args.quick]
    for row in table:  # the profiler's Chrome traces, kept for GPU_CHECKLIST item 5
        row.argv = [logs / Path(a).name if isinstance(a, Path) and a.name.startswith('trace') else a for a in row.argv]
    wanted = [w.strip() for w in args.rows.split(',') if w.strip()]
    if wanted:
        table = [r for r in table if any(w in r.name for w in wanted)]
        if not table:
            parser.error(f'--rows {args.rows!r} matches no row; see --list')
    if args.list:
        for row in table:
            estimate = f'  (about {row.estimate} s, estimated)' if row.estimate else ''
            print(f'{row.needs} GPU(s)  {row.name}{estimate}')
        if args.quick:
            print(
                f'total: about {sum(r.estimate or 0 for r in table)} s on one GPU (each row as measured on an H200, '
                'or estimated where it has not run there: verify/gpu/rows.py, quick_rows)'
            )
        return 0
    import torch
    import d2lpar

    gpus = d2lpar.num_gpus()
    driver = driver_gpus()
    status, message = preflight(
        driver, gpus, torch.version.cuda, torch.__version__, os.environ.get('CUDA_VISIBLE_DEVICES'), args.allow_cpu
    )
    if message:
        print(('ERROR ' if status else '') + message, file=sys.stderr if status else sys.stdout, flush=True)
    if status:
        print('\n'.join(gpu_facts(driver)), file=sys.stderr)
        return status
    from d2lpar.machinery.info import torch_problem

    too_old = torch_problem()  # the first GPU run had only torch 2.11 at hand: say so next to every verdict
    if too_old:
        print(f'note: {too_old} A row may fail for that reason alone.', flush=True)
    if driver['exclusive']:
        print(
            'note: the GPUs are in EXCLUSIVE_PROCESS compute mode: rows that put several '
            'processes on one GPU (notebook 2 on one GPU, device slots sharing a GPU) fail '
            'there; ask for the DEFAULT compute mode (nvidia-smi -c DEFAULT, as root)',
            flush=True,
        )
    # Stopped by `timeout` or a job scheduler: leave through the `finally`s, which end the row's
    # processes and remove the scratch folder.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    logs.mkdir(parents=True, exist_ok=True)
    summary = logs / 'summary.tsv'
    summary.write_text('row\tresult\tseconds\n')
    scratch.mkdir()
    results = []
    started = time.monotonic()
    try:
        for k, row in enumerate(table):
            if row.needs > gpus:
                result, seconds = f'SKIPPED (needs {row.needs} GPUs)', None
            elif args.budget is not None and time.monotonic() - started > args.budget:
                result, seconds = f'NOT RUN (past the {args.budget:.0f} s budget)', None
            else:
                print(f'[{k + 1}/{len(table)}] {row.name} ...', flush=True)
                slug = ''.join(c if c.isalnum() else '_' for c in row.name)[:60]
                log = logs / (slug + '.log')
                ok, seconds, note = run_row(row, log, scratch / 'results' / slug, args.online)
                result = 'PASS' if ok else f'FAIL ({note}; see {log})'
            results.append((row.name, result, seconds))
            if seconds is None:
                print(f'[{k + 1}/{len(table)}] {row.name}: {result}', flush=True)
            else:  # each verdict as soon as it is known: an interrupted run shows what ran
                print(f'    {result} ({seconds:.0f} s)', flush=True)
            with open(summary, 'a') as f:
                f.write(f'{row.name}\t{result}\t{"" if seconds is None else f"{seconds:.1f}"}\n')
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print('\n' + '\n'.join(gpu_facts(driver)) + '\n')
    width = max(len(name) for name, _, _ in results)
    for name, result, seconds in results:
        print(f'{name:{width}}  {"" if seconds is None else f"{seconds:6.0f} s"}  {result}')
    failed = sum(r.startswith('FAIL') for _, r, _ in results)
    ran = sum(s is not None for _, _, s in results)
    print(
        f'\n{ran - failed} passed, {failed} failed, {len(results) - ran} skipped or not run'
        f' ({time.monotonic() - started:.0f} s)'
    )
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
