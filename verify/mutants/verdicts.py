"""One mutant planted and run: its verdict (CAUGHT, CAUGHT-ELSEWHERE, SURVIVED, BROKEN) as a Row."""

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from verify.mutants.checks import named_check
from verify.mutants.plant import Broken, code_sources, copy_repo, notebook_path, plant, truncate
from verify.mutants.running import CELL_TIMEOUT, failing_line, first_failure, pytest, tail

ROOT = Path(__file__).resolve().parents[2]
RUN_FOLDER = 'm-'  # each mutant's scratch folder: mkdtemp adds 8 characters (see run_mutant)


class Row:
    def __init__(self, notebook, claim, name, verdict, check='', seconds=0.0, quick=False):
        self.notebook, self.claim, self.name = notebook, claim, name
        self.verdict, self.check, self.seconds, self.quick = verdict, check, seconds, quick


def run_mutant(mutant, root=ROOT, scratch=None, control=False):
    """Plant `mutant` (or, with control=True, nothing) in a copy of `root`; return its Row."""
    start = time.monotonic()
    # A short folder name, not the mutant's: the run's TMPDIR lies inside it, and a DataLoader
    # worker's socket (TMPDIR/pymp-*/listener-*) must fit in AF_UNIX's 104-108 bytes. With
    # the name here, a long one made nb07's loader workers hang instead of failing.
    base = Path(tempfile.mkdtemp(prefix=RUN_FOLDER, dir=scratch))
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
            code, cases, out = pytest(copy, [nb], f'{base.name}-{os.getpid()}', timeout=CELL_TIMEOUT * 4)
            ran = [c for c in cases if c[1].startswith('Cell ')]
            failed = first_failure(cases)
            if failed is None:
                return no_failure(mutant, label, control, code, ran, out, start, 'cell')
            where, error = failing_line(failed[3])
            cell = int(failed[1].split()[1]) if failed[1].startswith('Cell ') else None
            shown = f'{where}  [{error}]' if error else where
            named = named_check(code_sources(json.loads((copy / nb).read_text()))[number][1], mutant.catch)
            if cell == number and (named is None or where in named):
                verdict, check = 'CAUGHT', f'[{index}] {shown}'
            elif cell == number:
                verdict, check = 'CAUGHT-ELSEWHERE', f'[{index}] (not the check `catch` names) {shown}'
            else:
                verdict, check = 'CAUGHT-ELSEWHERE', f'[{code_index_to_cell(copy / nb, cell)}] (not [{index}]) {shown}'
            verdict = 'FAILED' if control else verdict
            return Row(mutant.notebook, mutant.claim, label, verdict, check, time.monotonic() - start)
        code, cases, out = pytest(copy, [mutant.run], f'{base.name}-{os.getpid()}', timeout=CELL_TIMEOUT * 4)
        failed = first_failure(cases)
        if failed is None:
            return no_failure(mutant, label, control, code, cases, out, start, 'test')
        where, error = failing_line(failed[3])
        key = mutant.catch.split('::')[-1]
        hit = failed[1] == key or failed[1].startswith(key + '[')
        verdict = 'FAILED' if control else ('CAUGHT' if hit else 'CAUGHT-ELSEWHERE')
        name = failed[1] if hit else f'{failed[1]} (not {key})'
        return Row(
            mutant.notebook, mutant.claim, label, verdict, f'{name}: {where}  [{error}]', time.monotonic() - start
        )
    except Broken as e:
        return Row(mutant.notebook, mutant.claim, label, 'BROKEN', str(e), time.monotonic() - start)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def no_failure(mutant, label, control, code, cases, out, start, unit):
    """Return the Row of a run in which nothing failed: PASSED (control) or SURVIVED (a mutant).

    A run that failed without a failing `unit` (a cell, a test) or ran none is Broken, not a verdict.
    """
    if code != 0 or not cases:
        raise Broken(f'pytest exited {code} without a failing {unit}: {tail(out)}')
    verdict = 'PASSED' if control else 'SURVIVED'
    return Row(mutant.notebook, mutant.claim, label, verdict, '', time.monotonic() - start)


def code_index_to_cell(path, number):
    if number is None:
        return '?'
    nb = json.loads(path.read_text())
    sources = code_sources(nb)
    return sources[number][0] if 0 <= number < len(sources) else '?'
