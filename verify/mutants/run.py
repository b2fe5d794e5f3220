"""Plant each bug of the registry in a scratch copy and check that the check meant for it fails.

    make mutants                                   # every mutant, then the exercise checkers' rows
    python verify/mutants/run.py --quick           # the fast subset CI runs
    python verify/mutants/run.py --only 08 -j 2    # one notebook (or one mutant by name), two at a time
    python verify/mutants/run.py --list            # what is registered, without running anything

For each mutant: copy the repository (tracked files and untracked ones git does
not ignore) into a scratch folder, replace `old` by `new` in `target` (exactly one
match, else BROKEN: a stale mutant is a failure too), keep the notebook only up
to the cell that contains `catch`, and run it as the test suite does (pytest with
nbval, `-x`, the copy's conftest and PYTHONPATH). Verdicts:

  CAUGHT           the cell that contains `catch` failed (or, with `run`, the named test); when
                   `catch` is text of one of the cell's checks (an assert, an assert_close), that
                   very check failed
  CAUGHT-ELSEWHERE something failed, but another cell, check or test: the registry points at the
                   wrong check
  SURVIVED         nothing failed: the check cannot see this bug
  BROKEN           the mutant no longer applies, or pytest itself could not run it
  CONTROL-FAILED   (--control) the unmutated notebook fails at that cell too, so the failure proves nothing
  NEEDS-GPU        not run: its check runs only where torch sees `gpus` CUDA GPUs, and this machine has
                   fewer (`--gpu-only` on a GPU machine runs just these)
  OTHER-CORES      not run: its check's branch runs only on machines with another number of usable
                   cores (the mutant's `cores`), e.g. DataLoader workers from 4 cores

The exercise checkers' wrong-answer tests (tests/exercises/, every test
whose name says `wrong`) are rows of the same table: each is a planted wrong
answer that its checker must reject with its hint, so a passing test reads
CAUGHT and a failing one SURVIVED. They run in one pytest call (not with --quick:
`make test` runs them anyway). Exit status 0 only when every row that ran is CAUGHT; the last
line counts the NEEDS-GPU and OTHER-CORES rows, which this machine cannot prove either way.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The pieces, one idea each: plant.py (the copy and the planted bug), running.py (pytest in the
# copy), verdicts.py (one mutant's row), exercise_rows.py (the checkers' wrong answers).
from verify.mutants.checks import unnamed_checks  # noqa: E402
from verify.mutants.exercise_rows import checker_of, exercise_chapters, exercise_rows  # noqa: E402,F401
from verify.mutants.plant import Broken, catch_cell, notebook_path, plant, truncate  # noqa: E402
from verify.mutants.registry import load  # noqa: E402
from verify.mutants.running import check_tmpdir  # noqa: E402
from verify.mutants.verdicts import RUN_FOLDER, Row, run_mutant  # noqa: E402


# --------------------------------------------------------------------- main

COLUMNS = ('notebook', 'claim', 'mutant', 'verdict', 'catching check', 's')


def print_row(row, lock=threading.Lock()):
    with lock:
        print(
            f'{row.notebook[:24]:24} | {row.claim[:40]:40} | {row.name[:40]:40} | '
            f'{row.verdict:16} | {row.check[:110]:110} | {row.seconds:5.0f}',
            flush=True,
        )


def select(mutants, quick=False, only=None, gpu_only=False):
    chosen = [m for m in mutants if (not quick or m.quick) and (not gpu_only or m.gpus)]
    if only:
        wanted = only.split(',')
        chosen = [m for m in chosen if any(m.name == w or m.notebook.startswith(w) or w in m.notebook for w in wanted)]
    return chosen


def cuda_gpus():
    """Return how many CUDA GPUs torch can use here (0 where CUDA cannot start)."""
    import torch  # here, not at the top: --list and --check need no torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def usable_cores():
    """Return the cores this process may use, as the notebooks count them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()


def waiting_row(mutant, gpus, cores):
    """Return the row of a mutant this machine cannot run (NEEDS-GPU, OTHER-CORES), or None."""
    if mutant.gpus > gpus:
        why = f'its check runs where torch sees {mutant.gpus} CUDA GPU(s); this machine has {gpus}'
        return Row(mutant.notebook, mutant.claim, mutant.name, 'NEEDS-GPU', why)
    if mutant.cores is not None and cores not in mutant.cores:
        start, stop = mutant.cores.start, mutant.cores.stop
        span = f'{start} or more' if stop > 1024 else f'{start} to {stop - 1}'
        why = f'its check runs with {span} usable cores; this machine has {cores}'
        return Row(mutant.notebook, mutant.claim, mutant.name, 'OTHER-CORES', why)
    return None


def apply_controls(rows, controls):
    """Mark a catch as unproven when the unmutated notebook fails at the same point."""
    failed = {c.notebook: c for c in controls if c.verdict == 'FAILED'}
    for row in rows:
        if row.notebook in failed and row.verdict in ('CAUGHT', 'CAUGHT-ELSEWHERE'):
            row.verdict = 'CONTROL-FAILED'
            row.check = f'unmutated notebook fails too: {failed[row.notebook].check}'


def check_all(mutants, root=ROOT):
    """Plant each mutant in a scratch copy without running it; print the ones that are BROKEN."""
    broken = 0
    with tempfile.TemporaryDirectory(prefix='d2lpar-mutants-') as scratch:
        for m in mutants:
            copy = Path(scratch) / 'repo'
            shutil.rmtree(copy, ignore_errors=True)
            copy.mkdir()
            for rel in {m.target, notebook_path(m)} - {None}:
                if (Path(root) / rel).is_file():
                    (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(Path(root) / rel, copy / rel)
            try:
                plant(copy, m)
                nb = notebook_path(m)
                if nb is not None:
                    truncate(copy / nb, m.catch)
            except (Broken, OSError, ValueError) as e:
                broken += 1
                print(f'BROKEN {m.name}: {e}')
    print(f'{len(mutants) - broken} of {len(mutants)} mutants apply')
    return 1 if broken else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='only the fast subset CI runs')
    parser.add_argument('--only', help='mutant names or notebooks (prefixes such as 08), comma-separated')
    parser.add_argument('-j', type=int, default=1, help='mutants run at a time (default 1)')
    parser.add_argument('--gpu-only', action='store_true', help='only the mutants whose check needs a GPU')
    parser.add_argument('--list', action='store_true', help='list the mutants and exit')
    parser.add_argument(
        '--control', action='store_true', help='also run each notebook unmutated up to its last catching cell'
    )
    parser.add_argument(
        '--check', action='store_true', help='only check that each mutant applies and names one cell (no runs)'
    )
    parser.add_argument(
        '--unnamed', action='store_true', help="list the notebooks' checks that no mutant's catch names, and exit"
    )
    parser.add_argument(
        '--no-exercises', action='store_true', help="leave out the exercise checkers' wrong-answer rows"
    )
    args = parser.parse_args(argv)

    mutants = select(load(), args.quick, args.only, args.gpu_only)
    if args.unnamed:
        paths = sorted((ROOT / 'notebooks').glob('[0-9][0-9]_*.ipynb'))
        unnamed = unnamed_checks(load(), [p for p in paths if not args.only or p.stem.startswith(args.only)])
        print('\n'.join(unnamed + [f'{len(unnamed)} checks no mutant names']))
        return 0
    if args.list:
        for m in mutants:
            tag = 'quick' if m.quick else (f'{m.gpus} GPU' if m.gpus else ('cores' if m.cores else ''))
            print(f'{m.notebook:24} {tag:5} {m.name:34} {m.claim}')
        print(f'{len(mutants)} mutants')
        return 0
    if args.check:
        return check_all(mutants)
    if not mutants and not args.only:
        print('no mutants registered')
        return 1

    scratch = tempfile.mkdtemp(prefix='d2lpar-mutants-')
    try:  # each run's TMPDIR is scratch/m-XXXXXXXX/tmp (verdicts.run_mutant): refuse now, not per row
        check_tmpdir(Path(scratch) / f'{RUN_FOLDER}XXXXXXXX' / 'tmp')
    except ValueError as e:
        shutil.rmtree(scratch, ignore_errors=True)
        print(e, file=sys.stderr)
        return 2
    start = time.monotonic()
    print(' | '.join(COLUMNS), flush=True)
    have, cores = (cuda_gpus() if any(m.gpus for m in mutants) else 0), usable_cores()
    here = [(m, waiting_row(m, have, cores)) for m in mutants]
    jobs = [m for m, row in here if row is None]
    waiting = [row for _, row in here if row is not None]
    for row in waiting:
        print_row(row)
    controls = []
    if args.control:  # one control per notebook, up to the last cell any of its mutants catches at
        last = {}
        for m in jobs:
            nb = notebook_path(m)
            if nb is None:
                continue
            try:
                src = json.loads((ROOT / nb).read_text())
                index = catch_cell(src, m.catch, nb)[0]
            except (Broken, OSError, ValueError):
                continue
            if index >= last.get(nb, (-1,))[0]:
                last[nb] = (index, m)
        controls = [m for _, m in last.values()]
    rows, control_rows = [], []
    try:
        with ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:
            futures = {pool.submit(run_mutant, m, ROOT, scratch): False for m in jobs}
            futures.update({pool.submit(run_mutant, m, ROOT, scratch, True): True for m in controls})
            exercises = None
            if not args.quick and not args.no_exercises and not args.gpu_only:
                exercises = pool.submit(exercise_rows, ROOT, args.only, scratch)
            for future in as_completed(futures):  # each row as soon as it is known
                row = future.result()
                (control_rows if futures[future] else rows).append(row)
                print_row(row)
            if exercises is not None:
                for row in exercises.result():
                    rows.append(row)
                    print_row(row)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    apply_controls(rows, control_rows)
    ran = len(rows)
    bad = [r for r in rows if r.verdict != 'CAUGHT']
    rows += waiting
    counts = {}
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    if control_rows:
        print('controls: ' + ', '.join(f'{c.notebook} {c.verdict}' for c in control_rows))
    if bad:
        print('\nnot caught by their check:')
        for row in bad:
            print(f'  {row.name}: {row.verdict} {row.check}')
    print(
        f'\n{len(rows)} rows: '
        + ', '.join(f'{n} {v}' for v, n in sorted(counts.items()))
        + f'; {time.monotonic() - start:.0f} s'
    )
    gpu_rows = [r for r in waiting if r.verdict == 'NEEDS-GPU']
    if gpu_rows:
        most = max(m.gpus for m in mutants)
        print(
            f'{len(gpu_rows)} NEEDS-GPU rows were not run (this machine: {have} CUDA GPU(s)): on a machine '
            f'with {most}, `make mutants MUTANTS_FLAGS=--gpu-only` runs them'
        )
    if len(waiting) > len(gpu_rows):
        print(
            f'{len(waiting) - len(gpu_rows)} OTHER-CORES rows were not run (this machine: {cores} usable '
            'cores): their checks run on a machine with another number of cores'
        )
    return 1 if bad or not ran else 0  # a run that proved nothing (all NEEDS-GPU) is no pass


if __name__ == '__main__':
    sys.exit(main())
