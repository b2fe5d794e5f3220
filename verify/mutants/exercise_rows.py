"""The exercise checkers' wrong-answer tests, read as rows of the mutants' table."""

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from verify.mutants.plant import copy_repo
from verify.mutants.running import failing_line, pytest, tail
from verify.mutants.verdicts import Row

ROOT = Path(__file__).resolve().parents[2]
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
        code, cases, out = pytest(
            copy,
            [EXERCISE_TESTS, '-k', 'wrong', '-p', 'no:randomly'],
            f'exercises-{os.getpid()}',
            timeout=900,
            first_failure_stops=False,
        )
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
        rows.append(Row(chapter, f'exercise: {checker} rejects it', answer, verdict, check, seconds * len(results)))
    if code not in (0, 1) and not rows:
        rows.append(
            Row('exercises', 'exercise checkers', EXERCISE_TESTS, 'BROKEN', tail(out), time.monotonic() - start)
        )
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
