"""The mutation runner's verdicts, on a tiny fake course: caught, survived, broken, caught elsewhere."""

import ast
import json
import textwrap
from pathlib import Path

import pytest

from verify.mutants import registry, run, verdicts
from verify.mutants.plant import Broken, code_sources
from verify.mutants.registry import Mutant

ROOT = Path(__file__).resolve().parent.parent

CELLS = [
    'x = 2',
    'def double(v):\n    return 2 * v',
    "assert double(3) == 6, 'double(3) is not 6'",
    'assert x == 2',
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
        ('2 * v', 'assert'),  # catch in 3 cells
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


def checks_in(source):
    """Return the first line of each check the cell runs: asserts and assert_close calls.

    A check inside a function the cell only defines runs where the function is called, and an
    `assert` inside a string (a script's diff) is no check of the cell's.
    """
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name not in called:
            skipped |= {id(n) for n in ast.walk(node)}
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        is_check = isinstance(node, ast.Assert) or (
            isinstance(node, ast.Call) and ast.unparse(node.func) in ('torch.testing.assert_close', 'assert_close')
        )
        if is_check:
            found.append(lines[node.lineno - 1].strip())
    return found


def checking_cells(nb):
    """Yield (index, source, checks) of each code cell of `nb` that checks something (scripts it writes aside)."""
    for i, source in code_sources(nb):
        if not source.startswith('%%writefile'):
            checks = checks_in(source)
            if checks:
                yield i, source, checks


def test_every_cell_that_checks_something_has_a_mutant_it_must_catch():
    """A check no planted bug is tied to is a check nobody has seen fail (those that need a GPU count too)."""
    mutants = [m for m in registry.load() if m.run is None]
    missing = []
    for path in sorted((ROOT / 'notebooks').glob('[0-9][0-9]_*.ipynb')):
        nb = json.loads(path.read_text())
        for i, source, checks in checking_cells(nb):
            if not any(m.notebook == path.stem and m.catch in source for m in mutants):
                missing.append(f'{path.stem}[{i}]: {checks[0][:80]}')
    assert not missing, 'cells whose checks no mutant is tied to:\n' + '\n'.join(missing)
