"""The checks a notebook cell runs (asserts, assert_close calls), read with `ast`, and which one a `catch` names."""

import ast
import json

from verify.mutants.plant import code_sources

CHECK_CALLS = ('torch.testing.assert_close', 'assert_close')


def check_spans(source):
    """Return [(first line, last line), ...] (1-based, in the cell) of each check the cell runs.

    A check inside a function the cell only defines runs where the function is called, and an
    `assert` inside a string (a script's diff) is no check of the cell's.
    """
    from IPython.core.inputtransformer2 import TransformerManager  # turns magics into Python, line for line

    tree = ast.parse(TransformerManager().transform_cell(source))
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name not in called:
            skipped |= {id(n) for n in ast.walk(node)}
    spans = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Assert) or (isinstance(node, ast.Call) and ast.unparse(node.func) in CHECK_CALLS):
            spans.append((node.lineno, node.end_lineno))
    return sorted(set(spans))


def check_lines(source):
    """Return the lines of each check the cell runs, as written, one list per check."""
    lines = source.splitlines()
    return [lines[first - 1 : last] for first, last in check_spans(source)]


def checks_in(source):
    """Return the first line of each check the cell runs, stripped."""
    return [check[0].strip() for check in check_lines(source)]


def named_check(source, catch):
    """Return the stripped lines of the one check whose text contains `catch`, or None when no check does.

    A `catch` inside a check names that check: the mutant is caught only when that check fails.
    A `catch` that names a cell by other text is caught by any failure in the cell.
    """
    found = next((check for check in check_lines(source) if catch in '\n'.join(check)), None)
    return None if found is None else [ln.strip() for ln in found]


def unnamed_checks(mutants, notebooks):
    """Return 'notebook: first line' of each check in `notebooks` (paths) whose text no mutant's `catch` is in.

    Scripts a cell writes (`%%writefile`) are left out: their checks run in the cell that runs them.
    """
    found = []
    for path in notebooks:
        catches = [m.catch for m in mutants if m.run is None and m.notebook == path.stem]
        for _, source in code_sources(json.loads(path.read_text())):
            if source.startswith('%%writefile'):
                continue
            for check in check_lines(source):
                if not any(c in '\n'.join(check) for c in catches):
                    found.append(f'{path.stem}: {check[0].strip()}')
    return found
