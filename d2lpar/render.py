"""Render the course: execute every notebook and write a static HTML site with an index.

`python -m d2lpar html` (or `python -m d2lpar.render`) runs each numbered
notebook in `notebooks/` with nbclient, in the notebook's folder, and writes
`build/html/index.html` plus one page per notebook with its outputs and
plots. Each page opens with a banner that says what it was executed on, as
reported by the kernel that ran it: hardware tier, torch version, date,
workload and which Fashion-MNIST it saw. `--small` renders with the test
suite's small workload (D2LPAR_SMALL=1), for CI; the default is full size.
"""

import argparse
import datetime
import html
import json
import os
import re
import sys
import time
from pathlib import Path

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
_STANDIN_WARNING = 'Fashion-MNIST STAND-IN'
_NAME = re.compile(r'\d\d_\w+\.ipynb$')

_PAGE_TEMPLATE = r'''{%- extends 'index.html.j2' -%}
{#- No require.js: the pages have no widgets, and it is one request fewer offline. -#}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_css -%}<style>{{ resources.d2lpar_css }}</style>{%- endblock html_head_css -%}
{%- block body_header -%}
{{ super() }}
{{ resources.d2lpar_header }}
{%- endblock body_header -%}
{%- block body_footer -%}
{{ resources.d2lpar_footer }}
{{ super() }}
{%- endblock body_footer -%}
'''

_CSS = '''
.d2lpar-nav { font: 14px sans-serif; margin: 0.5em 0; }
.d2lpar-nav a { margin-right: 1.5em; }
.d2lpar-banner { font: 14px sans-serif; border: 1px solid #9ab; background: #eef5fb;
                 padding: 0.6em 1em; margin: 0.5em 0 1em 0; border-radius: 4px; }
.d2lpar-banner.failed { border-color: #c33; background: #fdecec; }
.d2lpar-banner b { font-weight: 600; }
table.d2lpar-index { border-collapse: collapse; font: 15px sans-serif; }
table.d2lpar-index td, table.d2lpar-index th { border-bottom: 1px solid #ccd;
                 padding: 0.4em 0.8em; text-align: left; vertical-align: top; }
.d2lpar-status-failed { color: #b00; font-weight: 600; }
.d2lpar-time { white-space: nowrap; }
'''


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


def _text(output):
    if output.get('output_type') == 'stream':
        return output.get('text', '')
    data = output.get('data', {})
    return data.get('text/plain', '') if isinstance(data, dict) else ''


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


def _inline_code(text):
    """Return `text` as HTML, with markdown's `code` spans as <code>."""
    return re.sub(r'`([^`]+)`', r'<code>\1</code>', html.escape(text))


def _title(nb, path):
    for cell in nb.cells:
        if cell.cell_type == 'markdown':
            for line in cell.source.splitlines():
                if line.startswith('# '):
                    return line[2:].strip()
    return path.stem


def _first_output_lines(nb):
    """Return the text lines the first code cell printed (show_setup's tier line among them)."""
    for cell in nb.cells:
        if cell.cell_type == 'code':
            return ''.join(_text(o) for o in cell.get('outputs', [])).splitlines()
    return []


def _data_note(nb, setup):
    printed = '\n'.join(_text(o) for c in nb.cells if c.cell_type == 'code' for o in c.get('outputs', []))
    if _STANDIN_WARNING in printed:
        return 'the generated Fashion-MNIST <b>stand-in</b> (not the real data set)'
    if 'load_data_fashion_mnist' in '\n'.join(c.source for c in nb.cells if c.cell_type == 'code'):
        return html.escape(setup.get('data', 'unknown'))
    return 'none'


def _banner(result, nb, stamp):
    s = result.setup
    if 'tier' in s:
        gpus = ', '.join(s['gpus']) or 'no GPU visible'
        mask = s.get('cuda_visible_devices')
        hardware = (
            f'<b>{html.escape(s["tier"])}</b> ({html.escape(gpus)}'
            f'{", CUDA_VISIBLE_DEVICES=" + html.escape(mask) if mask is not None else ""})'
            f'; torch {html.escape(s["torch"])} (CUDA {html.escape(str(s["cuda"]))}), '
            f'Python {html.escape(s["python"])}'
        )
        workload = '<b>small</b> (D2LPAR_SMALL=1, the quick run)' if s['small'] else 'full size'
    else:
        hardware = html.escape(s.get('error', 'unknown'))
        workload = 'unknown'
    lines = [
        f'Executed on {hardware}, {stamp}, in {result.seconds:.0f} s.',
        f'Workload: {workload}. Fashion-MNIST: {_data_note(nb, s)}.',
    ]
    if not result.ok:
        lines.append(
            f'<b>Execution FAILED</b>: {html.escape(result.error)}. The page shows the outputs up to the failing cell.'
        )
    css = 'd2lpar-banner' + ('' if result.ok else ' failed')
    return f'<div class="{css}">' + '<br>'.join(lines) + '</div>'


def _nav(results, k):
    links = ['<a href="index.html">&uarr; all notebooks</a>']
    if k > 0:
        links.append(f'<a href="{results[k - 1].page}">&larr; {html.escape(results[k - 1].plain_title)}</a>')
    if k + 1 < len(results):
        links.append(f'<a href="{results[k + 1].page}">{html.escape(results[k + 1].plain_title)} &rarr;</a>')
    return '<nav class="d2lpar-nav">' + ''.join(links) + '</nav>'


def _export(nb, title, header, footer):
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        template_name='lab',
        template_file='d2lpar_page.html.j2',
        extra_loaders=[DictLoader({'d2lpar_page.html.j2': _PAGE_TEMPLATE})],
    )
    body, _ = exporter.from_notebook_node(
        nb,
        resources={'metadata': {'name': title}, 'd2lpar_header': header, 'd2lpar_footer': footer, 'd2lpar_css': _CSS},
    )
    return body


def _table(results):
    rows = [
        '<table class="d2lpar-index">',
        '<tr><th>notebook</th><th>title</th><th>ran on (its first cell)</th><th>time</th><th>status</th></tr>',
    ]
    for r in results:
        tier = html.escape(r.tier_line or '(the first cell printed no tier line)')
        status = 'ok' if r.ok else f'<span class="d2lpar-status-failed">FAILED: {html.escape(r.error)}</span>'
        rows.append(
            f'<tr><td><a href="{r.page}">{html.escape(r.source.stem)}</a></td>'
            f'<td>{_inline_code(r.title)}</td><td>{tier}</td>'
            f'<td class="d2lpar-time">{r.seconds:.0f} s</td><td>{status}</td></tr>'
        )
    return '\n'.join(rows + ['</table>'])


def _index(results, stamp, small, notebooks_dir):
    course = [r for r in results if r.source.parent.name != 'solutions']
    solutions = [r for r in results if r.source.parent.name == 'solutions']
    extra = '<h2>Reference solutions (for instructors)</h2>\n' + _table(solutions) if solutions else ''
    workload = 'the <b>small</b> workload (D2LPAR_SMALL=1, as in CI)' if small else 'the full workload'
    return f'''<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>d2lpar: the course, rendered</title>
<style>body {{ font: 15px sans-serif; margin: 2em auto; max-width: 72em; padding: 0 1em; }}
{_CSS}</style>
</head>
<body>
<h1>d2lpar: multi-GPU training in PyTorch</h1>
<p>The notebooks of <code>{html.escape(str(notebooks_dir))}</code>, in course order, each
executed top to bottom and rendered with its outputs and plots, on {stamp} with {workload}.
Each page opens with a banner saying what it was executed on.</p>
{_table(course)}
{extra}
</body>
</html>
'''


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
    `out_dir` is not run again (d2lpar/render_cache.py).
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
    parser = argparse.ArgumentParser(prog='python -m d2lpar.render', description=__doc__.split('\n')[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == '__main__':
    sys.exit(main())
