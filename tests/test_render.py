"""The rendered course: executed pages with banners, an index in order, and a real browser that shows the plots.

The browser test drives headless Chromium; it skips when Chromium is absent,
unless D2LPAR_REQUIRE_BROWSER=1 (CI) makes that a failure.
"""

import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

import d2lpar
from d2lpar.machinery import render

ROOT = Path(__file__).resolve().parent.parent

PLOT_CELLS = [
    '# A page with `plots`\n\nA synthetic notebook: one matplotlib figure and one Animator.',
    'import d2lpar\nd2lpar.show_setup(data=True)',
    'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()',
    'import os\nprint("cwd", os.getcwd())\n'
    'animator = d2lpar.Animator(xlabel="epoch", legend=["loss"])\n'
    'for epoch in range(3):\n    animator.add(epoch, 1 / (epoch + 1))',
]
DATA_CELLS = [
    '# A page that loads data',
    'import d2lpar\nd2lpar.show_setup(data=True)',
    'train_iter, test_iter = d2lpar.load_data_fashion_mnist(256)\nprint(len(train_iter))',
]
FAILING_CELLS = [
    '# A page that fails',
    'import d2lpar\nd2lpar.show_setup()',
    'assert 1 == 2, "a claim that stopped being true"',
    'print("never", "runs")',
]
PLOTS = {'01_plots': 2, '02_data': 0, '03_fails': 0}


def write_notebook(path, cells):
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell(c) if c.startswith('#') else nbformat.v4.new_code_cell(c) for c in cells]
    )
    nbformat.write(nb, path)


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    """Render three synthetic notebooks (plots, data, a failure) with the small workload."""
    base = tmp_path_factory.mktemp('course')
    notebooks, out = base / 'notebooks', base / 'html'
    notebooks.mkdir()
    write_notebook(notebooks / '01_plots.ipynb', PLOT_CELLS)
    write_notebook(notebooks / '02_data.ipynb', DATA_CELLS)
    write_notebook(notebooks / '03_fails.ipynb', FAILING_CELLS)
    write_notebook(notebooks / 'scratch.ipynb', ['print("not a numbered notebook")'])
    lines = []
    results = render.render_course(notebooks, out, small=True, timeout=300, echo=lines.append)
    return notebooks, out, results, lines


def test_index_lists_the_notebooks_in_order_with_tiers(site):
    notebooks, out, results, lines = site
    assert [r.source.name for r in results] == ['01_plots.ipynb', '02_data.ipynb', '03_fails.ipynb']
    index = (out / 'index.html').read_text()
    links = re.findall(r'<a href="([^"]+)">', index)
    assert links == ['01_plots.html', '02_data.html', '03_fails.html']
    assert 'A page with <code>plots</code>' in index
    assert '<title>A page with plots</title>' in (out / '01_plots.html').read_text()
    tier = f'hardware tier: {d2lpar.hardware_tier()} '
    assert all(r.tier_line.startswith(tier) for r in results), [r.tier_line for r in results]
    assert index.count(html.escape(tier)) == 3
    assert 'small' in index and any('[3/3]' in line for line in lines)


def test_each_page_says_what_it_ran_on(site):
    notebooks, out, results, _ = site
    import torch

    for r in results:
        page = (out / r.page).read_text()
        banner = re.search(r'<div class="d2lpar-banner[^"]*">(.*?)</div>', page, re.S).group(1)
        assert f'<b>{d2lpar.hardware_tier()}</b>' in banner and torch.__version__ in banner
        assert 'D2LPAR_SMALL=1' in banner, banner
        assert re.search(r'\d{4}-\d\d-\d\d \d\d:\d\d', banner), banner
    data_banner = (out / '02_data.html').read_text()
    if d2lpar.fashion_mnist_source().startswith('generated stand-in'):
        assert '<b>stand-in</b>' in data_banner
    else:
        assert 'real Fashion-MNIST' in data_banner
    assert 'Fashion-MNIST: none' in (out / '01_plots.html').read_text()


def test_pages_hold_outputs_and_run_in_the_notebook_folder(site):
    notebooks, out, results, _ = site
    page = (out / '01_plots.html').read_text()
    assert f'cwd {notebooks.resolve()}' in page
    # The Animator redraws one display in place: one PNG for it, not one per epoch.
    assert page.count('src="data:image/png;base64,') == PLOTS['01_plots']


def test_a_failing_notebook_is_marked_and_keeps_its_outputs(site):
    notebooks, out, results, lines = site
    failed = results[2]
    assert not failed.ok and 'AssertionError' in failed.error and 'cell 3' in failed.error
    page = (out / failed.page).read_text()
    assert 'Execution FAILED' in page and 'a claim that stopped being true' in page
    assert 'never runs' not in page  # execution stopped at the failing cell
    assert 'FAILED' in (out / 'index.html').read_text()
    assert results[0].ok and results[1].ok
    assert 'FAILED: 03_fails' in lines[-1]
    assert not list(out.glob('.*.tmp')), 'a temporary file was left behind'


def test_full_size_is_the_default(tmp_path):
    notebooks = tmp_path / 'nb'
    notebooks.mkdir()
    write_notebook(notebooks / '01_setup.ipynb', ['# Setup', 'import d2lpar\nd2lpar.show_setup()'])
    [result] = render.render_course(notebooks, tmp_path / 'out', echo=lambda line: None)
    assert result.ok and result.setup['small'] is False
    page = (tmp_path / 'out' / '01_setup.html').read_text()
    assert 'Workload: full size' in page and 'workload: full' in page


def test_an_unchanged_notebook_is_not_run_again(tmp_path):
    """The cache skips a run while the code is unchanged, and runs it again after a code edit."""
    notebooks, out, lines = tmp_path / 'nb', tmp_path / 'out', []
    notebooks.mkdir()
    counts = (
        'import pathlib\nruns = pathlib.Path("runs.txt")\nruns.write_text(runs.read_text() + "x" '
        'if runs.exists() else "x")\nprint("run number", len(runs.read_text()))'
    )
    write_notebook(notebooks / '01_count.ipynb', ['# Counting runs', counts])
    runs = notebooks / 'runs.txt'

    def render_it(**kw):
        [result] = render.render_course(notebooks, out, small=True, timeout=300, echo=lines.append, **kw)
        return result, (out / '01_count.html').read_text()

    first, _ = render_it()
    second, page = render_it()
    assert first.ok and second.ok and runs.read_text() == 'x'  # the second render ran nothing
    assert 'run number 1' in page and any('from the cache' in line for line in lines)
    write_notebook(notebooks / '01_count.ipynb', ['# Counting runs, retitled', counts])
    _, page = render_it()
    assert runs.read_text() == 'x' and 'retitled' in page and 'run number 1' in page  # Markdown only
    write_notebook(notebooks / '01_count.ipynb', ['# Counting runs', counts + '\nprint("edited")'])
    _, page = render_it()
    assert runs.read_text() == 'xx' and 'edited' in page  # a code edit runs it again
    render_it(cache=False)
    assert runs.read_text() == 'xxx'


def test_bad_requests_get_clear_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match='not a folder of notebooks'):
        render.find_notebooks(tmp_path / 'missing')
    with pytest.raises(ValueError, match='no numbered notebooks'):
        render.find_notebooks(tmp_path)
    write_notebook(tmp_path / '01_a.ipynb', ['# A'])
    with pytest.raises(ValueError, match='no notebook named 09_b.*choose from 01_a'):
        render.find_notebooks(tmp_path, only=['09_b'])
    with pytest.raises(ValueError, match='timeout'):
        render.render_course(tmp_path, tmp_path / 'out', timeout=0)
    assert not (tmp_path / 'out').exists()
    assert render.main(['--notebooks', str(tmp_path / 'missing')]) == 2
    assert 'not a folder of notebooks' in capsys.readouterr().err


def test_solutions_come_last_and_only_when_asked(tmp_path):
    write_notebook(tmp_path / '02_b.ipynb', ['# B'])
    write_notebook(tmp_path / '01_a.ipynb', ['# A'])
    (tmp_path / 'solutions').mkdir()
    write_notebook(tmp_path / 'solutions' / '01_a_solutions.ipynb', ['# A solved'])
    assert [p.name for p in render.find_notebooks(tmp_path)] == ['01_a.ipynb', '02_b.ipynb']
    assert [p.name for p in render.find_notebooks(tmp_path, solutions=True)] == [
        '01_a.ipynb',
        '02_b.ipynb',
        '01_a_solutions.ipynb',
    ]


def test_the_command_is_wired_into_python_m_d2lpar():
    out = subprocess.run(
        [sys.executable, '-m', 'd2lpar', 'html', '--help'], capture_output=True, text=True, check=True
    ).stdout
    assert '--small' in out and '--out' in out and '--solutions' in out


# ------------------------------------------------------------- real browser

CHROMIUM_FLAGS = [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
]

# Appended to a copy of a page: after load, write what the browser sees into the DOM.
PROBE = '''<script>
window.addEventListener('load', function () {
  var pngs = Array.prototype.filter.call(document.querySelectorAll('img'), function (i) {
    return i.src.indexOf('data:image/png') === 0; });
  var result = {
    title: document.title,
    images: pngs.map(function (i) { return [i.complete, i.naturalWidth, i.naturalHeight]; }),
    links: Array.prototype.map.call(document.querySelectorAll('a[href]'),
                                    function (a) { return a.getAttribute('href'); }),
    banner: (document.querySelector('.d2lpar-banner') || {}).textContent || ''
  };
  var pre = document.createElement('pre');
  pre.id = 'd2lpar-probe';
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
});
</script>'''


def find_chromium():
    for name in ('chromium', 'chromium-browser', 'google-chrome'):
        if shutil.which(name):
            return shutil.which(name)
    reason = (
        'headless Chromium is not installed (Debian: apt-get install -y chromium), so '
        'the rendered pages cannot be checked in a browser'
    )
    if d2lpar.env_flag('D2LPAR_REQUIRE_BROWSER'):
        pytest.fail(reason + '; D2LPAR_REQUIRE_BROWSER=1 requires it')
    pytest.skip(reason)


def chromium(binary, *args):
    with tempfile.TemporaryDirectory(prefix='d2lpar-chromium-') as profile:
        return subprocess.run(
            [binary, *CHROMIUM_FLAGS, f'--user-data-dir={profile}', *args], capture_output=True, text=True, timeout=120
        )


def seen_in_browser(binary, page):
    """Load a copy of `page` with the probe script in Chromium; return what the probe saw."""
    probe = page.with_name(f'_probe_{page.name}')
    probe.write_text(page.read_text().replace('</body>', PROBE + '</body>'))
    try:
        run = chromium(binary, '--virtual-time-budget=10000', '--dump-dom', probe.as_uri())
    finally:
        probe.unlink()
    found = re.search(r'<pre id="d2lpar-probe">(.*?)</pre>', run.stdout, re.S)
    assert found, f'the probe did not run in Chromium:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}'
    return json.loads(html.unescape(found.group(1)))


def test_browser_shows_index_pages_and_plots(site, tmp_path):
    binary = find_chromium()
    notebooks, out, results, _ = site
    index = seen_in_browser(binary, out / 'index.html')
    assert index['title'].startswith('d2lpar')
    assert index['links'] == [r.page for r in results]
    for r in results:
        page = seen_in_browser(binary, out / r.page)
        assert page['title'] == r.plain_title
        assert 'index.html' in page['links']
        assert f'Executed on {d2lpar.hardware_tier()}' in page['banner']
        assert len(page['images']) == PLOTS[r.source.stem], page['images']
        assert all(done and w > 0 and h > 0 for done, w, h in page['images']), page['images']
    # A screenshot of the page with plots is not blank: it has ink, and colour from the lines.
    shot = tmp_path / 'plots.png'
    chromium(binary, '--window-size=1000,1400', f'--screenshot={shot}', (out / '01_plots.html').as_uri())
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (1400, 1000)
    dark = (pixels.mean(axis=2) < 0.5).mean()
    colour = (pixels.max(axis=2) - pixels.min(axis=2) > 0.3).mean()
    assert dark > 0.002 and colour > 0.0005, (dark, colour)
