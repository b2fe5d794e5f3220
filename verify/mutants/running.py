"""pytest run in a scratch copy as the test suite runs it; its report read back; leftovers ended."""

import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

ANSI = re.compile(r'(\x1b|#x1B)\[[0-9;]*m')
ARROW = re.compile(r'^-*>\s*\d+\s(.*)$')  # IPython marks the failing line with ---->
MARK = 'D2LPAR_MUTANT_RUN'  # carried by every process a run starts, so leftovers can be ended
CELL_TIMEOUT = 300  # a planted bug may hang; a cell that times out fails
# multiprocessing (a DataLoader's workers) opens a socket at TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX,
# 32 bytes past TMPDIR, and AF_UNIX holds 104 bytes on macOS (108 on Linux): past that the workers
# hang, they do not fail. A run's TMPDIR must leave that room.
TMPDIR_MAX = 104 - 1 - len('/pymp-XXXXXXXX/listener-XXXXXXXX')


def check_tmpdir(path):
    """Raise ValueError when `path` is too long to be a run's TMPDIR (see TMPDIR_MAX)."""
    size = len(os.fsencode(str(path)))
    if size > TMPDIR_MAX:
        raise ValueError(
            f'verify/mutants: the scratch folder {path} is {size} bytes long, and a run inside it needs at '
            f'most {TMPDIR_MAX} (DataLoader workers open sockets there); set TMPDIR to a shorter folder, '
            'e.g. TMPDIR=/tmp make mutants'
        )


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
    check_tmpdir(tmp)
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(copy), TMPDIR=str(tmp), **{MARK: tag})
    cmd = [
        sys.executable,
        '-m',
        'pytest',
        *(['-x'] if first_failure_stops else []),
        '-q',
        f'--junitxml={report}',
        f'--nbval-cell-timeout={CELL_TIMEOUT}',
        *args,
    ]
    try:
        proc = subprocess.run(
            cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True
        )
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
            status = 'failed' if problems else ('skipped' if case.find('skipped') is not None else 'passed')
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
    where = next((a for a in arrows if a.startswith(('assert', 'torch.testing.assert'))), arrows[0] if arrows else '')
    if not where:  # pytest's own assertion report: `>       assert ...`
        where = next((ln[1:].strip() for ln in lines if ln.startswith('>')), '')
    errors = [ln.strip() for ln in lines if re.match(r'\s*(E\s+)?[\w.]*(Error|Exception|Interrupt)\b', ln)]
    error = errors[-1] if errors else ''
    if not where and not error:  # a timeout, a dead kernel: the report's last words
        error = next((ln.strip() for ln in reversed(lines) if ln.strip()), '')
    return where, error


def first_failure(cases):
    return next((c for c in cases if c[2] == 'failed'), None)


def tail(out, n=300):
    return ' '.join(out.split())[-n:]
