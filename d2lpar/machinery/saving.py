"""Write a notebook's `#@save` cells into a module that launched scripts import.

A script started with `d2lpar.launch` runs in fresh processes, which cannot see
functions defined in the notebook's kernel. `save_cells(path)` writes every
`#@save` cell the kernel has run into `path`, preceded by the imports (from any
cell the kernel has run) that those cells use, and keeps the file up to date:
from then on, each time a `#@save` cell runs, the file is written again. A
learner who edits a saved cell and runs it sees the edit in the next launch.

    d2lpar.save_cells(work / 'ddp_steps.py')  # scripts in `work` then `import ddp_steps`

Cells run in the order the kernel ran them, so a cell run again later replaces
its earlier definitions, exactly as in the kernel.
"""

import ast
import os
import tempfile
from pathlib import Path

__all__ = ['apply_diff', 'save_cells', 'saved_source', 'used_imports', 'write_next']

MARK = '#@save'


def _kernel():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _is_import(node):
    return isinstance(node, (ast.Import, ast.ImportFrom)) and not (
        isinstance(node, ast.ImportFrom) and node.module == '__future__'
    )


def _bound(alias, node):
    """Return the name an import alias binds: `x` for `import x.y` and for `... as x`."""
    if alias.asname:
        return alias.asname
    return alias.name if isinstance(node, ast.ImportFrom) else alias.name.split('.')[0]


def used_imports(cells, saved, module=None):
    """Return the import lines of `cells` that bind a name the `saved` sources use.

    `cells` are source strings in the order they ran (cells that do not parse are
    skipped); imports of `module` itself are left out.
    """
    imports = []
    for source in cells:
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a cell that failed to parse never defined anything
            continue
        imports += [node for node in tree.body if _is_import(node)]
    used = {node.id for source in saved for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}
    lines = []
    for node in imports:
        names = [node.module] if isinstance(node, ast.ImportFrom) else [alias.name for alias in node.names]
        if module in names:
            continue
        node.names = [alias for alias in node.names if alias.name == '*' or _bound(alias, node) in used]
        line = ast.unparse(node)
        if node.names and line not in lines:
            lines.append(line)
    return lines


def saved_source(cells, module=None):
    """Return a module's text: the imports its `#@save` cells use, then those cells.

    `cells` are source strings in the order they ran. An import is kept when a saved
    cell uses a name it binds (so every rank importing the module skips, say,
    matplotlib); imports of `module` itself are left out (a script imports the module,
    not the other way round).
    """
    saved = []
    for source in cells:
        try:
            ast.parse(source)
        except SyntaxError:
            continue
        if source.lstrip().startswith(MARK):
            saved.append(source.strip())
    lines = used_imports(cells, saved, module)
    header = '"""The #@save cells of a notebook, written by d2lpar.save_cells."""'
    return '\n\n\n'.join([header + '\n' + '\n'.join(lines), *saved]) + '\n'


def write_whole(path, text):
    """Replace `path` with `text` atomically: a reader never sees half a file."""

    def write(tmp):
        with open(tmp, 'w', encoding='utf-8') as f:
            f.write(text)

    replace_whole(path, write)


def replace_whole(path, write):
    """Call `write(tmp)` on a new file beside `path`, then put it in `path`'s place atomically.

    A reader sees the old file or the whole new one, never half of one. If `write` raises
    (a full disk, an interrupt), `path` stays as it was and the temporary file is removed.
    For writers that take a file name: torch.save, Figure.savefig (tell it the format: the
    temporary name ends in .tmp, which readers that look for *.json or *.pt skip).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the file is as readable as any other
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_cells(path):
    """Write this notebook's `#@save` cells into module `path` and keep it current."""
    path = Path(path)
    if path.suffix != '.py' or not path.stem.isidentifier():
        raise ValueError(f'save_cells: path must name a Python module such as work/steps.py, got {str(path)!r}')
    if not path.parent.is_dir():
        raise ValueError(f'save_cells: folder {str(path.parent)!r} does not exist; create it first')
    shell = _kernel()
    if shell is None or 'In' not in shell.user_ns:
        raise RuntimeError(
            'save_cells: runs inside a Jupyter or IPython kernel, which keeps the '
            'cells it ran; in a plain script, import the functions instead'
        )
    path = path.resolve()
    # The cells run so far, then each cell as it finishes. Not `In` alone: a kernel driven
    # with store_history=False (nbval, some front ends) never adds to it.
    ran = list(shell.user_ns['In'])

    def write(result=None):
        if result is not None:
            if not result.success:  # a broken edit keeps the old module
                return
            source = shell.transform_cell(str(result.info.raw_cell))
            if not ran or ran[-1] != source:  # the cell that called save_cells is in In already
                ran.append(source)
            if not str(result.info.raw_cell).lstrip().startswith(MARK):
                return  # nothing new to save
            if not path.parent.is_dir():  # the notebook removed its scratch folder at the end
                events.unregister('post_run_cell', write)
                print(
                    f'save_cells: {path.parent} is gone, so {path.name} is no longer kept '
                    'up to date; call d2lpar.save_cells again to start over'
                )
                return
        write_whole(path, saved_source(ran, module=path.stem))

    events = shell.events
    for callback in list(events.callbacks['post_run_cell']):
        if getattr(callback, 'd2lpar_saves_to', None) == path:
            events.unregister('post_run_cell', callback)
    write.d2lpar_saves_to = path
    events.register('post_run_cell', write)
    write()
    return path


def apply_diff(text, diff):
    """Return `text` changed by the unified diff `diff` (hunks only, as `diff -u` prints them).

    Each hunk starts with a header `@@ -start,count +start,count @@`; its lines start with
    ' ' (kept), '-' (removed) or '+' (added). A hunk applies only where its kept and removed
    lines match the text exactly, at the line its header names, as `git apply` demands.
    """
    old, new, at = text.splitlines(), [], 0
    hunks = []
    for line in diff.strip('\n').splitlines():
        if line.startswith('@@'):
            head = line.split('@@')[1].split() if line.count('@@') >= 2 else []
            if len(head) != 2 or not head[0].startswith('-') or not head[1].startswith('+'):
                raise ValueError(f'apply_diff: a hunk header reads "@@ -12,3 +12,5 @@", got {line!r}')
            start = int(head[0][1:].split(',')[0])
            hunks.append((start, line, []))
        elif not hunks:
            if line.startswith(('---', '+++')) or not line.strip():
                continue  # file names of a full diff
            raise ValueError(f'apply_diff: the diff must start with a hunk header "@@ -a,b +c,d @@", got {line!r}')
        elif line[:1] in (' ', '-', '+') or line == '':
            hunks[-1][2].append(line if line else ' ')
        else:
            raise ValueError(f"apply_diff: a hunk's lines start with ' ', '-' or '+', got {line!r}")
    if not hunks:
        raise ValueError('apply_diff: the diff holds no hunk')
    for start, header, lines in hunks:
        want = [line[1:] for line in lines if line[0] in ' -']
        begin = max(start - 1, 0) if want else start  # "-12,0": insert after line 12
        if begin < at:
            raise ValueError(f'apply_diff: hunks must come in the order of the file: {header}')
        if old[begin : begin + len(want)] != want:
            found = old[begin : begin + len(want)]
            raise ValueError(
                f'apply_diff: hunk {header} does not match the file at line {start}: '
                f'expected {want[:3]}..., the file has {found[:3]}...'
            )
        new += old[at:begin] + [line[1:] for line in lines if line[0] in ' +']
        at = begin + len(want)
    return ''.join(line + '\n' for line in new + old[at:])


def write_next(old, new, diff):
    """Write script `new`: script `old` changed by the unified diff `diff`; print what changed."""
    old, new = Path(old), Path(new)
    if not old.is_file():
        raise ValueError(f'write_next: {str(old)!r} does not exist; run the cell that writes it first')
    text = apply_diff(old.read_text(encoding='utf-8'), diff)
    write_whole(new, text)
    marks = [line[:1] for line in diff.splitlines() if not line.startswith(('---', '+++', '@@'))]
    print(
        f'Writing {new.name}: {old.name} with {marks.count("+")} lines added, '
        f'{marks.count("-")} removed ({len(text.splitlines())} lines)'
    )
