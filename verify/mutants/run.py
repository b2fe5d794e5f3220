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

  CAUGHT           the cell that contains `catch` failed (or, with `run`, the named test)
  CAUGHT-ELSEWHERE something failed, but another cell or test: the registry points at the wrong check
  SURVIVED         nothing failed: the check cannot see this bug
  BROKEN           the mutant no longer applies, or pytest itself could not run it
  CONTROL-FAILED   (--control) the unmutated notebook fails at that cell too, so the failure proves nothing

The exercise checkers' wrong-answer tests (tests/exercises/, every test
whose name says `wrong`) are rows of the same table: each is a planted wrong
answer that its checker must reject with its hint, so a passing test reads
CAUGHT and a failing one SURVIVED. They run in one pytest call (not with --quick:
`make test` runs them anyway). Exit status 0 only when every row is CAUGHT.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from verify.mutants.registry import load  # noqa: E402

ANSI = re.compile(r'(\x1b|#x1B)\[[0-9;]*m')
ARROW = re.compile(r'^-*>\s*\d+\s(.*)$')  # IPython marks the failing line with ---->
MARK = 'D2LPAR_MUTANT_RUN'  # carried by every process a run starts, so leftovers can be ended
CELL_TIMEOUT = 300  # a planted bug may hang; a cell that times out fails


# ----------------------------------------------------------------- planting

class Broken(Exception):
    """The mutant cannot be planted as written."""


def repo_files(root):
    """Return the repository's tracked files and the untracked ones git does not ignore."""
    try:
        out = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard', '-z'], cwd=root,
                             capture_output=True, text=True, check=True).stdout
        return [p for p in out.split('\0') if p and (Path(root) / p).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything but caches
        skip = {'.git', '.venv', '.venv-floor', '__pycache__', 'build', '.ipynb_checkpoints'}
        return [str(p.relative_to(root)) for p in Path(root).rglob('*')
                if p.is_file() and not skip & set(p.relative_to(root).parts)]


def copy_repo(root, dest):
    for rel in repo_files(root):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(root) / rel, dest / rel)


def code_sources(nb):
    return [(i, ''.join(c['source'])) for i, c in enumerate(nb['cells']) if c['cell_type'] == 'code']


def set_source(cell, text):
    cell['source'] = text.splitlines(keepends=True)
    cell['outputs'], cell['execution_count'] = [], None


def plant(copy, mutant):
    """Replace mutant.old by mutant.new in the copy; raise Broken unless it matches exactly once."""
    path = copy / mutant.target
    if not path.is_file():
        raise Broken(f'target {mutant.target} does not exist')
    if mutant.old == mutant.new:
        raise Broken('old and new are the same text')
    if path.suffix == '.ipynb':
        nb = json.loads(path.read_text())
        hits = [(i, s.count(mutant.old)) for i, s in code_sources(nb) if mutant.old in s]
        total = sum(n for _, n in hits)
        if total != 1:
            raise Broken(f'`old` matches {total} times in the code cells of {mutant.target}')
        i = hits[0][0]
        set_source(nb['cells'][i], ''.join(nb['cells'][i]['source']).replace(mutant.old, mutant.new))
        path.write_text(json.dumps(nb, indent=1))
    else:
        text = path.read_text()
        if text.count(mutant.old) != 1:
            raise Broken(f'`old` matches {text.count(mutant.old)} times in {mutant.target}')
        path.write_text(text.replace(mutant.old, mutant.new))


def notebook_path(mutant):
    """Return the repo-relative notebook a mutant runs, or None when it runs a test."""
    if mutant.run is None:
        return f'notebooks/{mutant.notebook}.ipynb'
    return mutant.run if mutant.run.endswith('.ipynb') else None


def catch_cell(nb, catch, where):
    """Return (cell index, code-cell number) of the one code cell that contains `catch`."""
    hits = [(k, i) for k, (i, s) in enumerate(code_sources(nb)) if catch in s]
    if len(hits) != 1:
        raise Broken(f'`catch` is in {len(hits)} code cells of {where}; it must name one')
    k, i = hits[0]
    return i, k


def truncate(path, catch):
    """Keep the notebook up to the cell that contains `catch`; return its (cell index, code number)."""
    nb = json.loads(path.read_text())
    index, number = catch_cell(nb, catch, path.name)
    nb['cells'] = nb['cells'][:index + 1]
    path.write_text(json.dumps(nb, indent=1))
    return index, number


# ------------------------------------------------------------------ running

def end_leftovers(tag):
    """End every process that still carries this run's tag (Linux /proc); return how many."""
    ended = 0
    if not os.path.isdir('/proc/self'):
        return ended
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f'/proc/{entry}/environ', 'rb') as f:
                if f'{MARK}={tag}'.encode() not in f.read().split(b'\0'):
                    continue
            os.kill(int(entry), signal.SIGKILL)
            ended += 1
        except OSError:
            continue
    return ended


def pytest(copy, args, tag, timeout, first_failure_stops=True):
    """Run pytest in the copy as the test suite does; return (returncode, junit testcases, output)."""
    report = copy.parent / 'report.xml'
    tmp = copy.parent / 'tmp'
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(copy), TMPDIR=str(tmp), **{MARK: tag})
    cmd = [sys.executable, '-m', 'pytest', *(['-x'] if first_failure_stops else []), '-q',
           f'--junitxml={report}',
           f'--nbval-cell-timeout={CELL_TIMEOUT}', *args]
    try:
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        code, out = 'timeout', f'pytest ran past {timeout} s\n{e.stdout or ""}'
    finally:
        end_leftovers(tag)
    cases = []
    try:
        for case in ET.parse(report).iter('testcase'):
            problems = list(case.findall('failure')) + list(case.findall('error'))
            text = '\n'.join(ANSI.sub('', p.text or p.get('message') or '') for p in problems)
            status = 'failed' if problems else (
                'skipped' if case.find('skipped') is not None else 'passed')
            cases.append((case.get('classname', ''), case.get('name', ''), status, text))
    except (OSError, ET.ParseError):
        pass
    return code, cases, out


def failing_line(text):
    """Return the source line the failure points at and the exception, from a traceback."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    # a chained exception prints its cause first: the cell's own traceback comes last
    last = re.split(r'The above exception was the direct cause|During handling of the above', text)[-1]
    arrows = [m.group(1).strip() for ln in last.splitlines() if (m := ARROW.match(ln.strip()))]
    arrows = arrows or [m.group(1).strip() for ln in lines if (m := ARROW.match(ln.strip()))]
    # the check itself when it is among the marked lines (a `finally:` may be marked first)
    where = next((a for a in arrows if a.startswith(('assert', 'torch.testing.assert'))),
                 arrows[0] if arrows else '')
    if not where:  # pytest's own assertion report: `>       assert ...`
        where = next((ln[1:].strip() for ln in lines if ln.startswith('>')), '')
    errors = [ln.strip() for ln in lines if re.match(r'\s*(E\s+)?[\w.]*(Error|Exception|Interrupt)\b', ln)]
    error = errors[-1] if errors else ''
    if not where and not error:  # a timeout, a dead kernel: the report's last words
        error = next((ln.strip() for ln in reversed(lines) if ln.strip()), '')
    return where, error


def first_failure(cases):
    return next((c for c in cases if c[2] == 'failed'), None)


class Row:
    def __init__(self, notebook, claim, name, verdict, check='', seconds=0.0, quick=False):
        self.notebook, self.claim, self.name = notebook, claim, name
        self.verdict, self.check, self.seconds, self.quick = verdict, check, seconds, quick


def run_mutant(mutant, root=ROOT, scratch=None, control=False):
    """Plant `mutant` (or, with control=True, nothing) in a copy of `root`; return its Row."""
    start = time.monotonic()
    safe = re.sub(r'[^\w-]', '_', mutant.name)  # a folder name, whatever the mutant's name
    base = Path(tempfile.mkdtemp(prefix=f'mutant-{safe}-', dir=scratch))
    copy = base / 'repo'
    label = '(control)' if control else mutant.name
    try:
        copy_repo(root, copy)
        if not control:
            plant(copy, mutant)
        nb = notebook_path(mutant)
        if nb is not None:
            if not (copy / nb).is_file():
                raise Broken(f'{nb} does not exist')
            index, number = truncate(copy / nb, mutant.catch)
            code, cases, out = pytest(copy, [nb], f'{base.name}-{os.getpid()}',
                                      timeout=CELL_TIMEOUT * 4)
            ran = [c for c in cases if c[1].startswith('Cell ')]
            failed = first_failure(cases)
            if failed is None:
                if code == 0 and ran:
                    return Row(mutant.notebook, mutant.claim, label,
                               'PASSED' if control else 'SURVIVED', '', time.monotonic() - start)
                raise Broken(f'pytest exited {code} without a failing cell: {tail(out)}')
            where, error = failing_line(failed[3])
            cell = int(failed[1].split()[1]) if failed[1].startswith('Cell ') else None
            shown = f'{where}  [{error}]' if error else where
            if cell == number:
                verdict = 'FAILED' if control else 'CAUGHT'
                return Row(mutant.notebook, mutant.claim, label, verdict,
                           f'[{index}] {shown}', time.monotonic() - start)
            at = code_index_to_cell(copy / nb, cell)
            verdict = 'FAILED' if control else 'CAUGHT-ELSEWHERE'
            return Row(mutant.notebook, mutant.claim, label, verdict,
                       f'[{at}] (not [{index}]) {shown}', time.monotonic() - start)
        code, cases, out = pytest(copy, [mutant.run], f'{base.name}-{os.getpid()}',
                                  timeout=CELL_TIMEOUT * 4)
        failed = first_failure(cases)
        if failed is None:
            if code == 0 and cases:
                return Row(mutant.notebook, mutant.claim, label,
                           'PASSED' if control else 'SURVIVED', '', time.monotonic() - start)
            raise Broken(f'pytest exited {code} without a failing test: {tail(out)}')
        where, error = failing_line(failed[3])
        key = mutant.catch.split('::')[-1]
        hit = failed[1] == key or failed[1].startswith(key + '[')
        verdict = 'FAILED' if control else ('CAUGHT' if hit else 'CAUGHT-ELSEWHERE')
        name = failed[1] if hit else f'{failed[1]} (not {key})'
        return Row(mutant.notebook, mutant.claim, label, verdict,
                   f'{name}: {where}  [{error}]', time.monotonic() - start)
    except Broken as e:
        return Row(mutant.notebook, mutant.claim, label, 'BROKEN', str(e), time.monotonic() - start)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def code_index_to_cell(path, number):
    if number is None:
        return '?'
    nb = json.loads(path.read_text())
    sources = code_sources(nb)
    return sources[number][0] if 0 <= number < len(sources) else '?'


def tail(out, n=300):
    return ' '.join(out.split())[-n:]


# ---------------------------------------------------------------- exercises

EXERCISE_TESTS = 'tests/exercises'  # one test file per checker module; reference.py holds CHECKS

def exercise_rows(root=ROOT, only=None, scratch=None):
    """Run the exercise checkers' wrong-answer tests once; return one Row per planted wrong answer."""
    start = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix='mutant-exercises-', dir=scratch))
    copy = base / 'repo'
    try:
        copy_repo(root, copy)
        if not (copy / EXERCISE_TESTS).is_dir():
            return []
        code, cases, out = pytest(copy, [EXERCISE_TESTS, '-k', 'wrong', '-p',
                                         'no:randomly'], f'exercises-{os.getpid()}', timeout=900,
                                    first_failure_stops=False)
        chapters = exercise_chapters(copy)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    seconds = (time.monotonic() - start) / max(len(cases), 1)
    grouped = {}
    for _, name, status, text in cases:
        name = re.sub(r'-\d+\]$', ']', name)  # one row for a wrong answer tried under several seeds
        grouped.setdefault(name, []).append((status, text))
    rows = []
    for name, results in grouped.items():
        fn, _, param = name.partition('[')
        param = param.rstrip(']')
        checker, chapter = checker_of(fn, param, chapters)
        if only and not (only in chapter or only in name or only == 'exercises'):
            continue
        bad = [t for s, t in results if s == 'failed']
        verdict = 'SURVIVED' if bad else 'CAUGHT'
        check = failing_line(bad[0])[1] if bad else 'its checker rejects it with the hint'
        answer = param.removeprefix(checker + '-')
        rows.append(Row(chapter, f'exercise: {checker} rejects it', answer, verdict, check,
                        seconds * len(results)))
    if code not in (0, 1) and not rows:
        rows.append(Row('exercises', 'exercise checkers', EXERCISE_TESTS, 'BROKEN',
                        tail(out), time.monotonic() - start))
    return rows


def exercise_chapters(copy):
    """Return {checker name: notebook} from the exercise tests' CHECKS, read without importing."""
    text = (copy / EXERCISE_TESTS / 'reference.py').read_text()
    return dict(re.findall(r"exercises\.(check_\w+):\s*\('(\w+)'", text))


def checker_of(fn, param, chapters):
    """Return (checker, notebook) of a wrong-answer test, from its name and parameters."""
    for checker, chapter in chapters.items():
        if param.startswith(checker + '-'):
            return checker, chapter
    key = fn.removeprefix('test_').split('_wrong')[0]
    for candidates in (key, key.split('_')[0]):
        for checker, chapter in chapters.items():
            if candidates in checker:
                return checker, chapter
    return key, 'exercises'


# --------------------------------------------------------------------- main

COLUMNS = ('notebook', 'claim', 'mutant', 'verdict', 'catching check', 's')


def print_row(row, lock=threading.Lock()):
    with lock:
        print(f'{row.notebook[:24]:24} | {row.claim[:40]:40} | {row.name[:40]:40} | '
              f'{row.verdict:16} | {row.check[:110]:110} | {row.seconds:5.0f}', flush=True)


def select(mutants, quick=False, only=None):
    chosen = [m for m in mutants if not quick or m.quick]
    if only:
        chosen = [m for m in chosen if m.name == only or m.notebook.startswith(only)
                  or only in m.notebook]
    return chosen


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
    parser.add_argument('--only', help='a mutant name, or a notebook (prefix such as 08)')
    parser.add_argument('-j', type=int, default=1, help='mutants run at a time (default 1)')
    parser.add_argument('--list', action='store_true', help='list the mutants and exit')
    parser.add_argument('--control', action='store_true',
                        help='also run each notebook unmutated up to its last catching cell')
    parser.add_argument('--check', action='store_true',
                        help='only check that each mutant applies and names one cell (no runs)')
    parser.add_argument('--no-exercises', action='store_true',
                        help="leave out the exercise checkers' wrong-answer rows")
    args = parser.parse_args(argv)

    mutants = select(load(), args.quick, args.only)
    if args.list:
        for m in mutants:
            print(f'{m.notebook:24} {"quick" if m.quick else "     "} {m.name:34} {m.claim}')
        print(f'{len(mutants)} mutants')
        return 0
    if args.check:
        return check_all(mutants)
    if not mutants and not args.only:
        print('no mutants registered')
        return 1

    scratch = tempfile.mkdtemp(prefix='d2lpar-mutants-')
    start = time.monotonic()
    print(' | '.join(COLUMNS), flush=True)
    jobs = list(mutants)
    controls = []
    if args.control:  # one control per notebook, up to the last cell any of its mutants catches at
        last = {}
        for m in mutants:
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
            futures.update({pool.submit(run_mutant, m, ROOT, scratch, True): True
                            for m in controls})
            exercises = None
            if not args.quick and not args.no_exercises:
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
    counts = {}
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    bad = [r for r in rows if r.verdict != 'CAUGHT']
    if control_rows:
        print('controls: ' + ', '.join(f'{c.notebook} {c.verdict}' for c in control_rows))
    if bad:
        print('\nnot caught by their check:')
        for row in bad:
            print(f'  {row.name}: {row.verdict} {row.check}')
    print(f'\n{len(rows)} rows: ' + ', '.join(f'{n} {v}' for v, n in sorted(counts.items()))
          + f'; {time.monotonic() - start:.0f} s')
    return 1 if bad or not rows else 0


if __name__ == '__main__':
    sys.exit(main())
