"""The pages of the rendered course: each notebook's HTML with its banner and links, and the index.

d2lpar/machinery/render.py executes the notebooks and calls these with what each run gave.
"""

import html
import re

_STANDIN_WARNING = 'Fashion-MNIST STAND-IN'

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


def _text(output):
    if output.get('output_type') == 'stream':
        return output.get('text', '')
    data = output.get('data', {})
    return data.get('text/plain', '') if isinstance(data, dict) else ''


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
