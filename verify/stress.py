"""Run every notebook and solution several times under CPU load, and report flaky cells.

    make stress                                   # 5 runs of each, one busy process per core
    python verify/stress.py --runs 3 --load 1 notebooks/05_ddp.ipynb

Each run executes one notebook exactly as the test suite does (`python -m
pytest NOTEBOOK`, so with conftest.py's small workload and the offline data),
while `--load` processes spin beside it to make races show. Runs are
interleaved (every notebook once, then again), so a slow period of the machine
does not fall on one notebook only. The report lists per notebook its runs,
passes and durations, and for each failure the run, the cell and the error.
After each run it checks that nothing was left behind: every process the run
started carries D2LPAR_STRESS_RUN, so one still alive (and any port it listens
on) is reported, then ended; the run's TMPDIR must be empty, and the repository
must have no new untracked file.
Exit status 0 only when every run passed and nothing was left.
"""

import argparse
import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r'(\x1b|#x1B)\[[0-9;]*m')  # JUnit XML spells ESC as #x1B
SPIN = 'while True: pass'
# torch's compile cache (torchinductor_USER) lives in the temporary directory by design.
KEPT_ON_PURPOSE = ('torchinductor_',)
MARK = 'D2LPAR_STRESS_RUN'  # carried by every process a run starts, so leftovers can be found


def default_notebooks():
    return sorted(glob.glob(str(ROOT / 'notebooks' / '[0-9]*.ipynb'))) + sorted(
        glob.glob(str(ROOT / 'notebooks' / 'solutions' / '[0-9]*.ipynb'))
    )


def start_load(count):
    """Start `count` processes that keep one core busy each."""
    return [subprocess.Popen([sys.executable, '-c', SPIN], start_new_session=True) for _ in range(count)]


def stop_load(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def listening_inodes():
    """Return {socket inode: port} of the TCP sockets listening on this machine (Linux)."""
    found = {}
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == '0A':  # LISTEN
                found[fields[9]] = int(fields[1].rsplit(':', 1)[1], 16)
    return found


def left_running(run_id):
    """Return [(pid, command, listening ports)] of live processes a run started (Linux)."""
    tag = f'{MARK}={run_id}'.encode()
    inodes = listening_inodes()
    left = []
    for entry in os.listdir('/proc') if os.path.isdir('/proc/self') else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f'/proc/{entry}/environ', 'rb') as f:
                if tag not in f.read().split(b'\0'):
                    continue
            with open(f'/proc/{entry}/cmdline', 'rb') as f:
                cmd = f.read().replace(b'\0', b' ').decode(errors='replace').strip()
            with open(f'/proc/{entry}/stat') as f:
                if f.read().rsplit(')', 1)[1].split()[0] in 'ZX':
                    continue
            ports = []
            for fd in os.listdir(f'/proc/{entry}/fd'):
                target = os.readlink(f'/proc/{entry}/fd/{fd}')
                if target.startswith('socket:[') and target[8:-1] in inodes:
                    ports.append(inodes[target[8:-1]])
        except OSError:  # ended meanwhile, or not ours to read
            continue
        left.append((int(entry), cmd[:120], sorted(ports)))
    return left


def untracked_files():
    """Return the files git does not track and does not ignore."""
    out = subprocess.run(
        ['git', 'ls-files', '--others', '--exclude-standard'], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(out.splitlines())


def failures_in(junit_xml):
    """Return [(cell, error)] of the failed or erroring test cases in a JUnit XML report."""
    try:
        tree = ET.parse(junit_xml)
    except (OSError, ET.ParseError) as e:
        return [('(no report)', f'pytest wrote no readable report: {e}')]
    found = []
    for case in tree.iter('testcase'):
        for problem in list(case.findall('failure')) + list(case.findall('error')):
            text = ANSI.sub('', problem.text or problem.get('message') or '')
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            errors = [line for line in lines if re.match(r'[\w.]*(Error|Exception|Interrupt)\b', line)]
            found.append((case.get('name', '?'), (errors or lines or ['?'])[-1][:300]))
    return found


def run_once(notebook, timeout, run_id):
    """Run one notebook under pytest; return (passed, seconds, [(cell, error)], [leftovers])."""
    with tempfile.TemporaryDirectory(prefix='d2lpar-stress-') as tmp:
        report, scratch = os.path.join(tmp, 'report.xml'), os.path.join(tmp, 'tmp')
        os.mkdir(scratch)  # the run's TMPDIR: whatever stays in it was left behind
        env = dict(os.environ, TMPDIR=scratch, **{MARK: run_id})
        start = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, '-m', 'pytest', notebook, '-q', f'--junitxml={report}'],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                start_new_session=True,
            )
            problems = failures_in(report)
            if done.returncode != 0 and not problems:
                tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ['?']
                problems = [('(pytest)', f'exit status {done.returncode}: {tail[0]}')]
            passed = done.returncode == 0 and not problems
        except subprocess.TimeoutExpired:
            passed, problems = False, [('(whole notebook)', f'no result within {timeout} s')]
        seconds = time.monotonic() - start
        time.sleep(1)  # a kernel that is ending gets a moment
        running = left_running(run_id)
        leftovers = [f'process {pid} ({cmd}) listening on {ports or "no port"}' for pid, cmd, ports in running]
        for pid, _, _ in running:  # end them, so the next run starts clean
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 5  # SIGKILL is delivered when the process next runs
        while any(_alive(pid) for pid, _, _ in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        leftovers += [
            f'file {os.path.join("$TMPDIR", name)}'
            for name in os.listdir(scratch)
            if not name.startswith(KEPT_ON_PURPOSE)
        ]
        return passed, seconds, problems, leftovers


def _alive(pid):
    """Return True if process `pid` still runs (a zombie, waiting for its reaper, does not)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] not in 'ZX'
    except OSError:
        return False


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('notebooks', nargs='*', help='default: every notebook and solution')
    parser.add_argument('--runs', type=int, default=5, help='runs of each notebook (default 5)')
    parser.add_argument(
        '--load', type=int, default=os.cpu_count() or 1, help='busy processes beside the runs (default: one per core)'
    )
    parser.add_argument(
        '--timeout', type=float, default=900, help='seconds one notebook may take before it counts as failed'
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.load < 0:
        parser.error('--runs must be at least 1 and --load at least 0')
    notebooks = [str(Path(n).resolve()) for n in args.notebooks] or default_notebooks()
    missing = [n for n in notebooks if not os.path.isfile(n)]
    if missing:
        parser.error(f'no notebook at {missing[0]}')

    files = untracked_files()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the load
    load = start_load(args.load)
    table = {n: {'passes': 0, 'seconds': [], 'failures': [], 'left': []} for n in notebooks}
    print(
        f'stress: {args.runs} run(s) of {len(notebooks)} notebook(s), {args.load} busy process(es) beside them',
        flush=True,
    )
    try:
        for run in range(1, args.runs + 1):
            for notebook in notebooks:
                run_id = f'{os.getpid()}-{run}-{len(table[notebook]["seconds"])}'
                passed, seconds, problems, leftovers = run_once(notebook, args.timeout, run_id)
                row = table[notebook]
                row['left'] += [(run, what) for what in leftovers]
                row['passes'] += passed
                row['seconds'].append(seconds)
                row['failures'] += [(run, cell, error) for cell, error in problems]
                name = os.path.relpath(notebook, ROOT)
                print(f'run {run}/{args.runs} {name}: {"pass" if passed else "FAIL"} ({seconds:.0f} s)', flush=True)
    finally:
        stop_load(load)

    width = max(len(os.path.relpath(n, ROOT)) for n in notebooks)
    print(f'\n{"notebook":{width}}  runs  passes  mean s  max s')
    failed = 0
    for notebook, row in table.items():
        name = os.path.relpath(notebook, ROOT)
        runs = len(row['seconds'])
        print(f'{name:{width}} {runs:5} {row["passes"]:7} {sum(row["seconds"]) / runs:7.0f} {max(row["seconds"]):6.0f}')
        for run, cell, error in row['failures']:
            print(f'    run {run}: {cell}: {error}')
        for run, what in row['left']:
            print(f'    run {run} left behind: {what}')
        failed += runs - row['passes']
    left = [what for row in table.values() for _, what in row['left']]
    new_files = sorted(untracked_files() - files)
    if new_files:
        left.append(f'new files in the repository: {new_files}')
    total = sum(len(row['seconds']) for row in table.values())
    print(f'\n{total - failed} passed, {failed} failed')
    print('left behind: ' + ('; '.join(left) if left else 'nothing'))
    return 1 if failed or left else 0


if __name__ == '__main__':
    sys.exit(main())
