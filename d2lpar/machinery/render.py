"""Render the course: execute every notebook and write a static HTML site with an index.

`python -m d2lpar html` (or `python -m d2lpar.machinery.render`) runs each numbered
notebook in `notebooks/` with nbclient, in the notebook's folder, and writes
`build/html/index.html` plus one page per notebook with its outputs and
plots. Each page opens with a banner that says what it was executed on, as
reported by the kernel that ran it: hardware tier, torch version, date,
workload and which Fashion-MNIST it saw. `--small` renders with the test
suite's small workload (D2LPAR_SMALL=1), for CI; the default is full size.
"""

import argparse
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path

from .render_pages import _banner, _text, _export, _first_output_lines, _index, _nav, _title
from .saving import write_whole

__all__ = ['find_notebooks', 'execute_notebook', 'render_course', 'PageResult', 'main']

# Run in the kernel after the notebook: what the page was executed on, as the kernel saw it.
_PROBE = '''
import json as _json, os as _os, platform as _platform
import torch as _torch
import d2lpar as _d2lpar
print(_json.dumps({
    'tier': _d2lpar.hardware_tier(),
    'gpus': [_torch.cuda.get_device_name(i) for i in range(_d2lpar.num_gpus())],
    'torch': _torch.__version__,
    'cuda': _torch.version.cuda,
    'python': _platform.python_version(),
    'small': _d2lpar.small_workload(),
    'data': _d2lpar.fashion_mnist_source(),
    'cuda_visible_devices': _os.environ.get('CUDA_VISIBLE_DEVICES'),
}))
'''
_NAME = re.compile(r'\d\d_\w+\.ipynb$')


class PageResult:
    """What rendering one notebook gave: its page, title, tier line, setup and error (if any)."""

    def __init__(self, source, page, title, tier_line, setup, seconds, error=None):
        self.source, self.page, self.title = source, page, title
        self.tier_line, self.setup, self.seconds, self.error = tier_line, setup, seconds, error

    @property
    def ok(self):
        return self.error is None

    @property
    def plain_title(self):
        """Return the title without markdown's backticks."""
        return self.title.replace('`', '')

    def __repr__(self):
        status = 'ok' if self.ok else f'FAILED ({self.error})'
        return f'PageResult({self.source.name}: {status}, {self.seconds:.0f} s)'


def find_notebooks(notebooks_dir='notebooks', only=None, solutions=False):
    """Return the numbered notebooks of `notebooks_dir` in course order (and their solutions)."""
    folder = Path(notebooks_dir)
    if not folder.is_dir():
        raise ValueError(
            f'render: {folder} is not a folder of notebooks; run from the repository root or pass --notebooks DIR'
        )
    found = sorted(p for p in folder.glob('*.ipynb') if _NAME.match(p.name))
    if solutions:
        found += sorted((folder / 'solutions').glob('*.ipynb'))
    if only:
        wanted = [Path(name).stem for name in only]
        unknown = [w for w in wanted if not any(p.stem == w for p in found)]
        if unknown:
            raise ValueError(
                f'render: no notebook named {", ".join(unknown)} in {folder}; '
                f'choose from {", ".join(p.stem for p in found)}'
            )
        found = [p for p in found if p.stem in wanted]
    if not found:
        raise ValueError(f'render: {folder} holds no numbered notebooks (NN_name.ipynb)')
    return found


def _kernel_env(small):
    env = dict(os.environ)
    env['D2LPAR_SMALL'] = '1' if small else '0'
    # An inherited non-interactive backend (the test suite sets Agg) would keep
    # plt.show() from putting PNGs into the page; the kernel picks inline itself.
    env.pop('MPLBACKEND', None)
    env.pop('PYTEST_CURRENT_TEST', None)  # ipykernel stops capturing child output under it
    return env


def execute_notebook(path, small=False, timeout=600, kernel_name='python3'):
    """Execute the notebook at `path` in its folder; return (nb, setup, seconds, error).

    `setup` is what the kernel reported after the run (tier, torch, workload,
    data); `error` is None, or a one-line description of the failure, in which
    case `nb` holds the outputs up to and including the failing cell.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name=kernel_name, resources={'metadata': {'path': str(path.parent.resolve())}}
    )
    error, setup = None, {}
    start = time.perf_counter()
    client.reset_execution_trackers()
    with client.setup_kernel(env=_kernel_env(small), cwd=str(path.parent.resolve())):
        try:
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
        except CellExecutionError as e:
            error = f'cell {index + 1} raised {e.ename}: {e.evalue}'
        except CellTimeoutError:
            error = f'cell {index + 1} ran longer than the {timeout} s timeout'
        except DeadKernelError:
            error = f'the kernel died in cell {index + 1}'
        seconds = time.perf_counter() - start
        if not isinstance(error, str) or 'kernel died' not in error:
            nb.cells.append(nbformat.v4.new_code_cell(_PROBE))
            try:
                client.execute_cell(nb.cells[-1], len(nb.cells) - 1, store_history=False)
                setup = json.loads(''.join(_text(o) for o in nb.cells[-1].outputs).strip())
            except Exception as e:  # the page still renders, saying what is unknown
                setup = {'error': f'the kernel could not report its setup ({e})'}
            finally:
                nb.cells.pop()
    return nb, setup, seconds, error


def render_course(
    notebooks_dir='notebooks',
    out_dir='build/html',
    small=False,
    timeout=600,
    only=None,
    solutions=False,
    echo=print,
    cache=True,
):
    """Execute the notebooks and write a static site to `out_dir`; return a PageResult per notebook.

    A notebook that fails still gets a page (with the outputs up to the error,
    marked as failed) and a FAILED row in the index. With `cache`, a notebook
    whose code and dependencies are unchanged since its last successful run in
    `out_dir` is not run again (d2lpar/machinery/render_cache.py).
    """
    import nbformat

    from . import render_cache

    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f'render: timeout must be a positive number of seconds per cell, got {timeout!r}')
    paths = find_notebooks(notebooks_dir, only, solutions)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')
    results, executed = [], []
    for k, path in enumerate(paths, 1):
        echo(f'[{k}/{len(paths)}] executing {path} ({"small" if small else "full"} workload) ...')
        nb = nbformat.read(path, as_version=4)
        key = render_cache.cache_key(nb, path, small)
        hit = render_cache.load(out / '.cache', path.stem, key, nb) if cache else None
        if hit:
            (setup, seconds), error = hit, None
            echo('      unchanged since its last run: outputs from the cache (--no-cache runs it)')
        else:
            nb, setup, seconds, error = execute_notebook(path, small, timeout)
            if error is None:
                render_cache.store(out / '.cache', path.stem, key, nb, setup, seconds)
        page = path.stem + '.html'
        tier = next((line.strip() for line in _first_output_lines(nb) if line.startswith('hardware tier')), None)
        result = PageResult(path, page, _title(nb, path), tier, setup, seconds, error)
        echo(f'      {"ok" if result.ok else "FAILED: " + error} in {seconds:.0f} s')
        results.append(result)
        executed.append(nb)
    for k, (result, nb) in enumerate(zip(results, executed)):
        nav = _nav(results, k)
        write_whole(out / result.page, _export(nb, result.plain_title, nav + _banner(result, nb, stamp), nav))
    write_whole(out / 'index.html', _index(results, stamp, small, notebooks_dir))
    failed = [r for r in results if not r.ok]
    echo(
        f'wrote {out / "index.html"} and {len(results)} page(s)'
        + (f'; {len(failed)} notebook(s) FAILED: {", ".join(r.source.stem for r in failed)}' if failed else '')
    )
    return results


def add_arguments(parser):
    """Add the options of the html command to an argparse parser."""
    parser.add_argument(
        '--small', action='store_true', help='use the small workload of the test suite (D2LPAR_SMALL=1), for CI'
    )
    parser.add_argument('--out', default='build/html', help='output folder (default build/html)')
    parser.add_argument('--notebooks', default='notebooks', help='folder of the numbered notebooks (default notebooks)')
    parser.add_argument(
        '--timeout', type=float, default=1800, help='seconds one cell may run before it counts as failed (default 1800)'
    )
    parser.add_argument(
        '--no-cache',
        dest='cache',
        action='store_false',
        help='run every notebook, even one unchanged since its last run',
    )
    parser.add_argument('--solutions', action='store_true', help='also render notebooks/solutions/ (for instructors)')
    parser.add_argument(
        'only', nargs='*', metavar='NOTEBOOK', help='render only these notebooks, e.g. 01_single_device'
    )


def run(args):
    """Run the html command from parsed arguments; return the exit status."""
    try:
        results = render_course(
            args.notebooks,
            args.out,
            small=args.small,
            timeout=args.timeout,
            only=args.only,
            solutions=args.solutions,
            cache=args.cache,
        )
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    return 0 if all(r.ok for r in results) else 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m d2lpar.machinery.render', description=__doc__.split('\n')[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == '__main__':
    sys.exit(main())
