"""Try the notebooks as a learner would: in JupyterLab, in a real browser, with Run All.

    make labcheck                                       # every notebook, small workload
    python verify/labcheck.py --full notebooks/05_ddp.ipynb
    python verify/labcheck.py --interrupt 'd2lpar.launch(' notebooks/05_ddp.ipynb

Needs Playwright and a Chromium (`pip install playwright`, then either
`playwright install chromium` or a system chromium, found on PATH). It copies
the notebooks to a temporary folder (the repository stays clean), starts
JupyterLab on a free port with a fresh workspace, and for each notebook opens
it, runs "Run All Cells", waits until the kernel is idle, saves it and reads
the saved file back: every code cell must have run, none may show an error.
A screenshot of the end of each notebook goes to --shots.

--interrupt TEXT (a notebook must have a code cell containing it, e.g.
'd2lpar.launch(') runs the notebook until the processes of its first launch
are alive (found by the D2LPAR_LAUNCH_ID the kernel gives them), presses the
interrupt button's command, and then checks what a learner expects: a cell
shows KeyboardInterrupt, the kernel is alive and idle, and no process the
launch started (nor a listening port it held) is left.
Exit status 0 only when every notebook passed.
"""

import argparse
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def launched_by(kernel_pid):
    """Return the pids of the live processes that d2lpar.launch started from `kernel_pid`."""
    from d2lpar.machinery.processes import launched_processes

    return [p.pid for p in launched_processes(f'{kernel_pid}-')]


def listening_ports(pids):
    """Return the TCP ports on which any of `pids` listens (Linux: ss)."""
    out = subprocess.run(['ss', '-ltnpH'], capture_output=True, text=True).stdout
    return sorted(
        {line.split()[3].rsplit(':', 1)[1] for line in out.splitlines() if any(f'pid={p},' in line for p in pids)}
    )


class Lab:
    """A JupyterLab server on a copy of the notebooks, and a browser page on it."""

    def __init__(self, folder, browser):
        self.folder, self.port, self.token = folder, free_port(), secrets.token_hex(16)
        jupyter = Path(sys.executable).with_name('jupyter')
        self.server = subprocess.Popen(
            [
                str(jupyter),
                'lab',
                '--no-browser',
                f'--port={self.port}',
                '--ip=127.0.0.1',
                f'--ServerApp.token={self.token}',
                f'--notebook-dir={folder}',
                f'--LabApp.workspaces_dir={folder}/.workspaces',
                '--LabApp.expose_app_in_browser=True',
                *(['--allow-root'] if os.getuid() == 0 else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(folder / 'jupyter.log', 'w'),
            start_new_session=True,
        )
        for _ in range(120):
            try:
                self.api('status')
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f'JupyterLab did not start; see {folder}/jupyter.log')
        self.page = browser.new_page(viewport={'width': 1400, 'height': 1000})

    def api(self, path):
        url = f'http://127.0.0.1:{self.port}/api/{path}?token={self.token}'
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.load(reply)

    def command(self, name, wait=True):
        """Run a JupyterLab command; with wait=False return at once (Run All resolves when done)."""
        call = f'window.jupyterapp.commands.execute({json.dumps(name)})'
        # A block's completion value is its last expression: the promise, which evaluate awaits.
        self.page.evaluate(call if wait else f'{{ {call}; undefined; }}')

    def shut_down(self, notebook):
        """Close `notebook`'s tab and end its session (and kernel), as a learner would."""
        self.command('docmanager:save')
        self.command('application:close')
        for s in self.api('sessions'):
            if s['path'].endswith(notebook):
                url = f'http://127.0.0.1:{self.port}/api/sessions/{s["id"]}?token={self.token}'
                urllib.request.urlopen(urllib.request.Request(url, method='DELETE'), timeout=30)

    def kernel(self, notebook):
        """Return (kernel pid, execution state) of the session on `notebook`."""
        for s in self.api('sessions'):
            if s['path'].endswith(notebook):
                kid = s['kernel']['id']
                out = subprocess.run(
                    ['pgrep', '-f', f'kernel-{kid}.json'], capture_output=True, text=True
                ).stdout.split()
                return (int(out[0]) if out else None), s['kernel']['execution_state']
        return None, 'missing'

    def open(self, notebook):
        self.page.goto(f'http://127.0.0.1:{self.port}/lab/tree/{notebook}?token={self.token}')
        # Run All acts on the current notebook only once its document and kernel are ready.
        self.page.wait_for_function(
            '''(() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                       const k = w && w.sessionContext && w.sessionContext.session
                                 && w.sessionContext.session.kernel;
                       return w && w.context && w.context.isReady && k && k.status === 'idle'; })()''',
            timeout=120000,
        )
        self.wait_idle(notebook, settle=2)

    def run_all(self, notebook):
        """Press Run All Cells; return once the kernel is seen busy (or raise)."""
        for attempt in range(3):
            self.command('notebook:run-all-cells', wait=False)
            for _ in range(40):
                if self.kernel(notebook)[1] == 'busy' or self.page.evaluate(
                    'window.jupyterapp.shell.currentWidget.content.widgets'
                    '.some(c => c.model.type === "code" && c.model.executionCount)'
                ):
                    return
                time.sleep(0.25)
        raise RuntimeError(f'{notebook}: Run All Cells did not start the kernel')

    def wait_idle(self, notebook, timeout=900, settle=5):
        """Wait until the kernel of `notebook` has been idle for `settle` seconds."""
        deadline, idle_since = time.time() + timeout, None
        while time.time() < deadline:
            pid, state = self.kernel(notebook)
            if state == 'idle':
                idle_since = idle_since or time.time()
                if time.time() - idle_since >= settle:
                    return
            else:
                idle_since = None
            time.sleep(0.5)
        raise TimeoutError(f'{notebook}: kernel still {state} after {timeout} s')

    def saved(self, notebook):
        self.command('docmanager:save')
        time.sleep(2)
        return json.loads((self.folder / notebook).read_text())

    def close(self):
        self.page.close()
        self.server.terminate()
        try:
            self.server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, 9)


def errors_in(nb):
    """Return (cells that never ran, cells with an error output) of a saved notebook."""
    code = [(i, c) for i, c in enumerate(nb['cells']) if c['cell_type'] == 'code']
    unrun = [i for i, c in code if c.get('execution_count') is None and ''.join(c['source']).strip()]
    failed = [
        (i, o.get('ename'), o.get('evalue', '')[:200])
        for i, c in code
        for o in c.get('outputs', [])
        if o.get('output_type') == 'error'
    ]
    return unrun, failed


def run_all(lab, notebook, shots):
    lab.open(notebook)
    start = time.time()
    lab.run_all(notebook)
    lab.wait_idle(notebook)
    seconds = time.time() - start
    nb = lab.saved(notebook)
    lab.command('notebook:move-cursor-down')
    lab.page.screenshot(path=str(shots / (Path(notebook).stem + '.png')))
    unrun, failed = errors_in(nb)
    ok = not failed and not unrun
    print(
        f'{"PASS" if ok else "FAIL"} {notebook}: {seconds:.0f} s'
        + (f', cells never run {unrun}' if unrun else '')
        + ''.join(f'\n    cell {i}: {e}: {v}' for i, e, v in failed),
        flush=True,
    )
    lab.shut_down(notebook)
    return ok


def cmdline(pid):
    """Return the command line of process `pid`, or '' once it has gone."""
    try:
        return Path(f'/proc/{pid}/cmdline').read_bytes().replace(b'\0', b' ').decode()
    except OSError:
        return ''


def interrupt(lab, notebook, text, shots, during=None):
    lab.open(notebook)
    nb = json.loads((lab.folder / notebook).read_text())
    target = next(
        (i for i, c in enumerate(nb['cells']) if c['cell_type'] == 'code' and text in ''.join(c['source'])), None
    )
    if target is None:
        print(f'FAIL {notebook}: no code cell contains {text!r}')
        return False
    kernel_ports = set(listening_ports([lab.kernel(notebook)[0]]))  # its own ZMQ ports
    lab.run_all(notebook)
    kernel_pid, deadline, launched, idle_since = None, time.time() + 600, [], None
    while time.time() < deadline:  # wait for the launch: processes carrying the kernel's launch id
        kernel_pid, state = lab.kernel(notebook)
        launched = launched_by(kernel_pid) if kernel_pid else []
        idle_since = (idle_since or time.time()) if state == 'idle' else None
        wanted = not during or any(during in cmdline(p) for p in launched)
        if (len(launched) >= 2 and wanted) or (idle_since and time.time() - idle_since > 5):
            break  # (the kernel is idle for a moment between cells: only a lasting idle is the end)
        time.sleep(0.2)
    if len(launched) < 2 or (during and not any(during in cmdline(p) for p in launched)):
        _, failed = errors_in(lab.saved(notebook))
        lab.page.screenshot(path=str(shots / (Path(notebook).stem + '-interrupt.png')))
        print(f'FAIL {notebook}: no launch seen (kernel {state}); errors: {failed}', flush=True)
        lab.shut_down(notebook)
        return False
    time.sleep(1.5)  # let the ranks get going
    launched = launched_by(kernel_pid)
    ports = listening_ports(launched)
    lab.command('notebook:interrupt-kernel')
    lab.wait_idle(notebook, timeout=120, settle=3)
    nb = lab.saved(notebook)
    lab.page.screenshot(path=str(shots / (Path(notebook).stem + '-interrupt.png')))
    left = [p for p in launched if Path(f'/proc/{p}').exists()]
    # the kernel itself hosts the launch's rendezvous store: that port must be closed too
    still = sorted(set(listening_ports(left + [kernel_pid])) - kernel_ports)
    stopped = [
        i for i, c in enumerate(nb['cells']) if any(o.get('ename') == 'KeyboardInterrupt' for o in c.get('outputs', []))
    ]
    interrupted = stopped == [target]  # the cell asked for, not an earlier launch
    alive, state = lab.kernel(notebook)
    ok = interrupted and not left and not still and alive == kernel_pid and state == 'idle'
    print(
        f'{"PASS" if ok else "FAIL"} {notebook} interrupted during a launch: '
        f'{len(launched)} launched processes (ports {ports}), left {left} (ports {still}), '
        f'KeyboardInterrupt shown in cell(s) {stopped} (asked: {target}), '
        f'kernel alive and idle: {alive == kernel_pid and state == "idle"}',
        flush=True,
    )
    lab.shut_down(notebook)
    return ok


def check_one(lab, notebook, text, shots, during=None):
    """Run or interrupt one notebook; a notebook that breaks the check fails, the rest go on."""
    try:
        return interrupt(lab, notebook, text, shots, during) if text else run_all(lab, notebook, shots)
    except Exception as e:  # a timeout, a page that never became ready, a vanished kernel
        lab.page.screenshot(path=str(shots / (Path(notebook).stem + '-broken.png')))
        print(f'FAIL {notebook}: {type(e).__name__}: {str(e).splitlines()[0]}', flush=True)
        try:
            lab.shut_down(notebook)
        except Exception:
            pass
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('notebooks', nargs='*', help='default: every notebook and solution')
    parser.add_argument('--full', action='store_true', help="the learner's full workload (default: small)")
    parser.add_argument('--interrupt', metavar='TEXT', help='interrupt the first cell containing TEXT')
    parser.add_argument(
        '--during',
        metavar='NAME',
        help='with --interrupt: wait for a launched process whose command line contains NAME '
        '(e.g. a script the cell starts) instead of the first launch',
    )
    parser.add_argument('--shots', default='build/labcheck', help='folder for screenshots')
    args = parser.parse_args()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit('labcheck needs Playwright: pip install playwright')
    chromium = shutil.which('chromium') or shutil.which('chromium-browser')
    notebooks = args.notebooks or sorted(glob.glob(str(ROOT / 'notebooks' / '[0-9]*.ipynb'))) + sorted(
        glob.glob(str(ROOT / 'notebooks' / 'solutions' / '[0-9]*.ipynb'))
    )
    notebooks = [str(Path(n).resolve().relative_to(ROOT / 'notebooks')) for n in notebooks]
    if args.interrupt and not args.notebooks:  # every notebook that has such a cell
        notebooks = [
            n
            for n in notebooks
            if any(
                c['cell_type'] == 'code' and args.interrupt in ''.join(c['source'])
                for c in json.loads((ROOT / 'notebooks' / n).read_text())['cells']
            )
        ]
    shots = Path(args.shots).resolve()
    shots.mkdir(parents=True, exist_ok=True)
    if not args.full:
        os.environ['D2LPAR_SMALL'] = '1'
    # `timeout` or `kill` send SIGTERM: leave through the `finally` that stops JupyterLab and
    # its kernels (they run in a session of their own and would outlive this process).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit('labcheck: stopped by SIGTERM'))
    with tempfile.TemporaryDirectory(prefix='labcheck-') as tmp:
        folder = Path(tmp) / 'notebooks'
        shutil.copytree(ROOT / 'notebooks', folder, ignore=shutil.ignore_patterns('.ipynb_checkpoints'))
        with sync_playwright() as p:
            try:
                browser = (
                    p.chromium.launch(executable_path=chromium, args=['--no-sandbox'])
                    if chromium
                    else p.chromium.launch()
                )
            except Exception as e:
                sys.exit(
                    f'labcheck could not start Chromium ({str(e).splitlines()[0]}): install '
                    'one (apt-get install chromium, or playwright install chromium)'
                )
            lab = Lab(folder, browser)
            try:
                results = [check_one(lab, n, args.interrupt, shots, args.during) for n in notebooks]
            finally:
                lab.close()
                browser.close()
    print(f'{sum(results)} of {len(results)} passed; screenshots in {shots}')
    sys.exit(0 if all(results) else 1)


if __name__ == '__main__':
    main()
