"""Every notebook's Exercises section calls a checker whose reference solution is in its solutions
notebook, and its stubs run as a learner meets them: "not attempted yet", never an exception."""

import ast
import contextlib
import io
import json
import re

import pytest

import d2lpar

from .reference import CHECKS, NOTEBOOKS


def chapters():
    return sorted(p for p in NOTEBOOKS.glob('[0-9][0-9]_*.ipynb'))


def exercise_cells(path):
    """Return the code cells of a notebook's Exercises section (stubs and checker calls)."""
    nb = json.loads(path.read_text())
    start = max(
        (
            i
            for i, c in enumerate(nb['cells'])
            if c['cell_type'] == 'markdown' and re.search(r'^#+\s*Exercises', ''.join(c['source']), re.M)
        ),
        default=None,
    )
    if start is None:
        return []
    return [''.join(c['source']) for c in nb['cells'][start:] if c['cell_type'] == 'code']


def run_cell(source, namespace, name):
    """Run a cell's code as Jupyter does; return the value of a final expression (else None)."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, name, 'exec'), namespace)
    if last is not None:
        return eval(compile(ast.Expression(last.value), name, 'eval'), namespace)


def checker_calls(source):
    return re.findall(r'exercises\.(check_\w+)\(', source)


def test_every_notebook_has_a_checked_exercise_with_a_solution():
    solved = {c.__name__: chapter for c, (chapter, _) in CHECKS.items()}
    for path in chapters():
        used = [name for source in exercise_cells(path) for name in checker_calls(source)]
        assert used, f'{path.name} has no checked exercise: its Exercises section calls no d2lpar.exercises checker'
        for name in used:
            assert name in solved, f'{path.name} calls exercises.{name}, which does not exist'
            assert solved[name] == path.stem, (
                f'{path.name}: the reference solution for {name} is in {solved[name]}_solutions'
            )


@pytest.mark.parametrize('path', chapters(), ids=lambda p: p.stem)
def test_notebook_stubs_are_not_attempted_and_never_raise(path):
    cells = exercise_cells(path)
    if not any(checker_calls(source) for source in cells):
        pytest.skip(f'{path.name} has no checked exercise yet')
    namespace = {'d2lpar': d2lpar}
    for source in cells:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            shown = run_cell(source, namespace, path.name)
        if checker_calls(source):  # it prints the verdict, or shows it as its last expression
            seen = printed.getvalue() + ('' if shown is None else str(shown))
            assert 'not attempted yet' in seen, seen
