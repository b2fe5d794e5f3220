"""d2l's `#@save` convention, checked: what a notebook teaches is the package's code.

A code cell whose first line is `#@save` holds code that the package keeps
too. Every function and class defined at the top level of such a cell must be
reachable as `d2lpar.<name>` (or `d2lpar.<module>.<name>` for modules that
notebooks import by name, listed in MODULES) and must have the same abstract
syntax tree as the package's definition, docstrings included, after two
normalisations:

- `d2lpar.name` in a notebook is `name` in the package (a cell reaches
  what earlier notebooks saved through the package, a module through its
  imports);
- the package's `@checked(...)` decorators are dropped: they validate the
  arguments before the algorithm runs and teach nothing about parallelism
  (see d2lpar/_checks.py).

Anything else in a saved cell (imports, constants) is not compared.
"""
import ast
import difflib
import importlib
import inspect
import json
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
MARK = '#@save'
# Submodules whose saved objects are not re-exported at the top of `d2lpar`:
# a notebook calls them as d2lpar.<module>.<name>.
MODULES = ('collectives', 'miniddp', 'zero', 'memory', 'fsdp', 'tensor_parallel', 'distributed',
           'ddp_practice', 'ddp', 'pipelining', 'expert_parallel', 'context_parallel',
           'capstone', 'fault_tolerance')


def saved_cells(path):
    """Return [(cell index, source)] of the notebook's code cells marked `#@save`."""
    cells = json.loads(Path(path).read_text())['cells']
    found = []
    for i, cell in enumerate(cells):
        source = ''.join(cell['source'])
        if cell['cell_type'] == 'code' and source.lstrip().startswith(MARK):
            found.append((i, source))
    return found


def definitions(source):
    """Return {name: node} for the functions and classes defined at the top of `source`."""
    tree = ast.parse(source)
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


class _Normalize(ast.NodeTransformer):
    def visit_Attribute(self, node):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == 'd2lpar':
            return ast.copy_location(ast.Name(id=node.attr, ctx=node.ctx), node)
        if (isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name)
                and node.value.value.id == 'd2lpar' and node.value.attr in MODULES):
            return ast.copy_location(ast.Name(id=node.attr, ctx=node.ctx), node)
        return node

    def _drop_checks(self, node):
        node.decorator_list = [d for d in node.decorator_list if not _is_checked(d)]
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _drop_checks


def _is_checked(decorator):
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, 'id', None)
    return name == 'checked'


def normalized(node):
    """Return the code of a definition as compared: ast.unparse after normalising."""
    node = _Normalize().visit(ast.parse(ast.unparse(node)).body[0])
    return ast.unparse(node)


def package_object(name):
    """Return the package's object called `name` (top level first, then MODULES), or None."""
    d2lpar = importlib.import_module('d2lpar')
    if hasattr(d2lpar, name):
        return getattr(d2lpar, name)
    for module in MODULES:
        try:
            mod = importlib.import_module(f'd2lpar.{module}')
        except ImportError:
            continue
        if hasattr(mod, name):
            return getattr(mod, name)
    return None


def package_definition(name):
    """Return the AST node of the package's definition of `name`, or None."""
    obj = package_object(name)
    if obj is None:
        return None
    obj = inspect.unwrap(obj)
    try:
        source = textwrap.dedent(inspect.getsource(obj))
    except (TypeError, OSError):
        return None
    return definitions(source).get(name)


def compare(notebook_node, package_node, name):
    """Return '' if the two definitions agree, else a unified diff (notebook vs package)."""
    if package_node is None:
        return f'{name}: saved in the notebook but not found in d2lpar'
    a, b = normalized(notebook_node), normalized(package_node)
    if a == b:
        return ''
    diff = difflib.unified_diff(a.splitlines(), b.splitlines(), 'notebook', 'd2lpar',
                                lineterm='')
    return f'{name}: the notebook and d2lpar differ\n' + '\n'.join(diff)


def problems(path, package_definition=package_definition):
    """Return a list of disagreements between a notebook's saved cells and the package."""
    found = []
    for index, source in saved_cells(path):
        for name, node in definitions(source).items():
            why = compare(node, package_definition(name), name)
            if why:
                found.append(f'{Path(path).name} cell {index}: {why}')
    return found


def saved_names(path):
    """Return the names a notebook saves, in order."""
    return [name for _, source in saved_cells(path) for name in definitions(source)]
