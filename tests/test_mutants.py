"""The mutation runner's verdicts, on a tiny fake course: caught, survived, broken, caught elsewhere."""

import json
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

from verify.mutants import registry, run, verdicts
from verify.mutants.checks import checks_in, named_check, unnamed_checks
from verify.mutants.plant import Broken
from verify.mutants.registry import Mutant
from verify.mutants.running import TMPDIR_MAX, check_tmpdir

ROOT = Path(__file__).resolve().parent.parent

CELLS = [
    'x = 2',
    'def double(v):\n    return 2 * v',
    "assert double(3) == 6, 'double(3) is not 6'",
    'assert x == 2',
    'y = 3\nassert double(1) == 2\nassert y + 1 == 4',
    "raise AssertionError('after the catching cell: never runs')",
]


@pytest.fixture(scope='module')
def course(tmp_path_factory):
    """A repository with one notebook, a module and a test of it, set up as the course's."""
    root = tmp_path_factory.mktemp('course')
    (root / 'pyproject.toml').write_text((ROOT / 'pyproject.toml').read_text())
    (root / 'conftest.py').write_text('')
    (root / 'notebooks').mkdir()
    nb = {
        'cells': [{'cell_type': 'markdown', 'metadata': {}, 'source': ['# Fake']}]
        + [
            {
                'cell_type': 'code',
                'execution_count': None,
                'id': f'c{i}',
                'metadata': {},
                'outputs': [],
                'source': src.splitlines(keepends=True),
            }
            for i, src in enumerate(CELLS)
        ],
        'metadata': {},
        'nbformat': 4,
        'nbformat_minor': 5,
    }
    (root / 'notebooks' / '00_fake.ipynb').write_text(json.dumps(nb, indent=1))
    (root / 'fake_mod.py').write_text('def half(v):\n    return v / 2\n')
    (root / 'tests').mkdir()
    (root / 'tests' / 'test_fake.py').write_text(
        textwrap.dedent('''
        from fake_mod import half

        def test_unrelated():
            assert 1 + 1 == 2

        def test_half():
            assert half(4) == 2
    ''')
    )
    return root


def mutant(old, new, catch, run=None, target='notebooks/00_fake.ipynb'):
    return Mutant(
        name='m', notebook='00_fake', claim='double doubles', target=target, old=old, new=new, catch=catch, run=run
    )


def verdict(course, m, **kw):
    return run.run_mutant(m, root=course, **kw)


def test_the_check_meant_for_it_catches_a_planted_bug(course):
    row = verdict(course, mutant('2 * v', '3 * v', 'double(3) == 6'))
    assert row.verdict == 'CAUGHT', row.check
    assert 'assert double(3) == 6' in row.check and '[3]' in row.check  # cell 3 of the file


def test_a_bug_no_check_sees_survives(course):
    # 2.0 == 2, so the check cannot tell; the cell after the catching one is cut, or it would fail
    assert verdict(course, mutant('x = 2', 'x = 2.0', 'x == 2')).verdict == 'SURVIVED'


def test_a_failure_in_another_cell_is_not_a_catch(course):
    row = verdict(course, mutant('x = 2', 'x = 1 / 0', 'double(3) == 6'))
    assert row.verdict == 'CAUGHT-ELSEWHERE', row.check
    assert row.check.startswith('[1] (not [3])') and 'ZeroDivisionError' in row.check


@pytest.mark.parametrize(
    'old, catch',
    [
        ('not in the notebook', 'double(3)'),  # stale
        ('v', 'double(3)'),  # ambiguous
        ('2 * v', 'assert'),  # catch in 4 cells
        ('2 * v', 'no such check'),
    ],
)
def test_a_mutant_that_does_not_apply_is_broken(course, old, catch):
    assert verdict(course, mutant(old, old + ' ', catch)).verdict == 'BROKEN'


def test_the_copy_is_changed_never_the_repository(course):
    before = (course / 'notebooks' / '00_fake.ipynb').read_text()
    verdict(course, mutant('2 * v', '3 * v', 'double(3) == 6'))
    assert (course / 'notebooks' / '00_fake.ipynb').read_text() == before


def test_a_mutant_of_a_module_is_caught_by_the_named_test(course):
    m = mutant('v / 2', 'v // 3', 'tests/test_fake.py::test_half', run='tests/test_fake.py', target='fake_mod.py')
    row = verdict(course, m)
    assert row.verdict == 'CAUGHT' and 'assert half(4) == 2' in row.check, row.check
    other = mutant('v / 2', 'v // 3', 'test_unrelated', run='tests/test_fake.py', target='fake_mod.py')
    assert verdict(course, other).verdict == 'CAUGHT-ELSEWHERE'


def test_the_control_passes_on_the_unmutated_notebook(course):
    row = verdict(course, mutant('2 * v', '3 * v', 'double(3) == 6'), control=True)
    assert row.verdict == 'PASSED'


@pytest.mark.parametrize('control, expected', [(False, 'SURVIVED'), (True, 'PASSED')])
def test_a_run_without_a_failure_is_survived_or_passed(control, expected):
    m = mutant('2 * v', '3 * v', 'double(3) == 6')
    row = verdicts.no_failure(m, 'label', control, 0, [('x', 'Cell 0')], '', start=0.0, unit='cell')
    fields = (row.notebook, row.claim, row.name, row.verdict, row.check, row.quick)
    assert fields == ('00_fake', 'double doubles', 'label', expected, '', False)
    assert row.seconds > 0  # time since `start`


@pytest.mark.parametrize('code, cases', [(1, [('x', 'test_a')]), (0, [])])
def test_a_run_that_failed_nowhere_or_ran_nothing_is_broken(code, cases):
    m = mutant('2 * v', '3 * v', 'double(3) == 6')
    with pytest.raises(Broken, match=f'pytest exited {code} without a failing test: .*collected 0'):
        verdicts.no_failure(m, 'm', False, code, cases, 'collected 0 items', start=0.0, unit='test')


def test_the_registry_loads_unique_names_and_every_notebook_has_a_quick_mutant():
    mutants = registry.load()
    assert len({m.name for m in mutants}) == len(mutants)
    for m in mutants:
        assert (ROOT / m.target).is_file(), m
        assert m.run or (ROOT / 'notebooks' / f'{m.notebook}.ipynb').is_file(), m
    notebooks = {m.notebook for m in mutants}
    assert notebooks <= {m.notebook for m in mutants if m.quick}


def test_every_registered_mutant_still_applies(capsys):
    """An edit to a notebook or a module can leave a planted bug with nothing to replace."""
    assert run.check_all(registry.load()) == 0, capsys.readouterr().out


def test_a_duplicate_name_is_refused(tmp_path):
    (tmp_path / 'nb00.py').write_text(
        'from verify.mutants.registry import Mutant\n'
        "MUTANTS = [Mutant('a', 'n', 'c', 't', 'o', 'n2', 'x')] * 2\n"
    )
    with pytest.raises(ValueError, match="'a'"):
        registry.load(tmp_path)


def test_exercise_rows_name_the_checker_and_its_notebook():
    chapters = run.exercise_chapters(ROOT)
    assert run.checker_of('test_wrong_answer_fails_with_its_hint', 'check_sampler-Padded-padding', chapters) == (
        'check_sampler',
        '05_ddp',
    )
    assert run.checker_of('test_merge_wrong_answers_get_their_hint', 'merge_no_rescale-x', chapters) == (
        'check_online_softmax_merge',
        '15_context_expert',
    )
    assert run.checker_of('test_zero2_hook_wrong_answers_get_their_hint', 'no-division', chapters) == (
        'check_zero2_hook',
        '10_zero',
    )


def test_a_mutant_whose_check_needs_a_gpu_is_not_run_without_one(course, monkeypatch, capsys):
    """Without the GPUs a mutant needs, its row says NEEDS-GPU; a run that proved nothing is no pass."""
    gpu = Mutant(
        'on-gpu', '00_fake', 'double doubles', 'notebooks/00_fake.ipynb', '2 * v', '3 * v', 'double(3) == 6', gpus=1
    )
    cpu = Mutant('on-cpu', '00_fake', 'x is 2', 'notebooks/00_fake.ipynb', 'x = 2', 'x = 3', 'assert x == 2')
    monkeypatch.setattr(run, 'ROOT', course)
    monkeypatch.setattr(run, 'cuda_gpus', lambda: 0)
    monkeypatch.setattr(run, 'load', lambda: [gpu, cpu])
    assert run.main(['--no-exercises']) == 0
    out = capsys.readouterr().out
    assert 'on-gpu' in out and 'NEEDS-GPU' in out and '1 CAUGHT, 1 NEEDS-GPU' in out
    assert '--gpu-only' in out.splitlines()[-1]
    assert run.main(['--gpu-only']) == 1  # nothing ran: nothing was proved
    monkeypatch.setattr(run, 'cuda_gpus', lambda: 1)  # with the GPU, it runs like any other
    assert run.main(['--gpu-only']) == 0
    assert '1 rows: 1 CAUGHT' in capsys.readouterr().out


def test_a_mutant_whose_check_needs_other_cores_is_not_run_here(course, monkeypatch, capsys):
    """A check in a branch that depends on the cores (DataLoader workers) runs only where it is taken."""
    fake = 'notebooks/00_fake.ipynb'
    many = Mutant(
        'on-many-cores', '00_fake', 'double doubles', fake, '2 * v', '3 * v', 'double(3) == 6', cores=range(4, 99)
    )
    few = Mutant('on-few-cores', '00_fake', 'x is 2', fake, 'x = 2', 'x = 3', 'assert x == 2', cores=range(1, 4))
    monkeypatch.setattr(run, 'ROOT', course)
    monkeypatch.setattr(run, 'load', lambda: [many, few])
    monkeypatch.setattr(run, 'usable_cores', lambda: 2)
    assert run.main(['--no-exercises']) == 0
    out = capsys.readouterr().out
    assert '1 CAUGHT, 1 OTHER-CORES' in out and 'its check runs with 4 to 98 usable cores; this machine has 2' in out
    monkeypatch.setattr(run, 'usable_cores', lambda: 8)
    assert run.main(['--no-exercises']) == 0
    out = capsys.readouterr().out
    assert '1 CAUGHT, 1 OTHER-CORES' in out and 'on-few-cores' in out.split('OTHER-CORES')[0].splitlines()[-1]


def test_every_check_a_notebook_makes_is_named_by_a_mutant_or_listed_as_a_gap():
    """A check no planted bug names is a check nobody has seen fail (those that need a GPU count too).

    The known gaps are listed in each nbNN_<notebook>.py as UNNAMED_CHECKS; the list may only shrink:
    a new check without its mutant fails here, and so does a listed check that is now named or gone.
    """
    paths = sorted((ROOT / 'notebooks').glob('[0-9][0-9]_*.ipynb'))
    found = set(unnamed_checks(registry.load(), paths))
    listed = {f'{nb}: {line}' for nb, lines in registry.unnamed_allowed().items() for line in lines}
    assert not found - listed, 'checks no mutant names (add one whose catch is in the check):\n' + '\n'.join(
        sorted(found - listed)
    )
    assert not listed - found, 'UNNAMED_CHECKS entries that are named now, or gone; remove them:\n' + '\n'.join(
        sorted(listed - found)
    )


def test_a_catch_inside_a_check_names_that_check_and_no_other():
    source = 'x = f()\nassert x > 0, x\ntorch.testing.assert_close(\n    x, 2\n)\ndef g():\n    assert False\n'
    assert checks_in(source) == ['assert x > 0, x', 'torch.testing.assert_close(']
    assert named_check(source, 'x, 2') == ['torch.testing.assert_close(', 'x, 2', ')']
    assert named_check(source, 'x = f()') is None  # names the cell only
    assert named_check(source, 'assert False') is None  # g is never called: no check of the cell's


def test_a_failure_at_another_check_of_the_named_cell_is_not_a_catch(course):
    row = verdict(course, mutant('y = 3', 'y = 4', 'double(1) == 2'))  # the cell's second check fails
    assert row.verdict == 'CAUGHT-ELSEWHERE', row.check
    assert row.check.startswith('[5] (not the check') and 'assert y + 1 == 4' in row.check
    assert verdict(course, mutant('y = 3', 'y = 4', 'y + 1 == 4')).verdict == 'CAUGHT'


def test_a_runs_temporary_folder_leaves_room_for_a_dataloader_socket(course, monkeypatch):
    """A long mutant name does not lengthen TMPDIR: DataLoader workers hang when their socket path is too long."""
    seen = []

    def fake_pytest(copy, args, tag, timeout):
        seen.append(copy.parent / 'tmp')
        return 0, [('nb', 'Cell 0', 'passed', '')], ''

    monkeypatch.setattr(verdicts, 'pytest', fake_pytest)
    long_name = Mutant(
        'a-mutant-whose-name-goes-on-' * 3,
        '00_fake',
        'x is 2',
        'notebooks/00_fake.ipynb',
        'x = 2',
        'x = 3',
        'assert x == 2',
    )
    scratch = tempfile.mkdtemp(prefix='d2lpar-mutants-')  # as run.main makes it
    try:
        verdicts.run_mutant(long_name, root=course, scratch=scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert len(seen) == 1 and 'whose-name' not in str(seen[0])
    check_tmpdir(seen[0])  # raises when too long
    with pytest.raises(ValueError, match='set TMPDIR to a shorter folder'):
        check_tmpdir(Path('/tmp') / ('x' * TMPDIR_MAX))
