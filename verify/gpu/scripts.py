"""`gpucheck.py script NOTEBOOK SCRIPT`: write a notebook's %%writefile script, launch it, check it."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from . import ROOT
from .checks import CheckFailed, _expect
from .rows import _python
from .script_checks import CHECKS


def prepare_script(notebook, script, tmpdir):
    """Write `script` as `notebook` does; return the notebook's work folder under `tmpdir`.

    Runs the notebook's first code cell (which makes `work` with tempfile.mkdtemp and calls
    save_cells), its `#@save` cells and the cell that writes `{work}/SCRIPT`, in that order: a
    `%%writefile {work}/SCRIPT` cell (with the `%%writefile -a {work}/SCRIPT` cells that add the
    script's later parts), or `d2lpar.write_next(work / 'OLD', work / 'SCRIPT', diff)`
    together with every earlier cell that writes a script (the versions it grows from).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = Path(notebook).resolve()
    nb = nbformat.read(notebook, as_version=4)
    code = [c for c in nb.cells if c.cell_type == 'code']
    header = f'%%writefile {{work}}/{script}\n'
    grown = 'd2lpar.write_next(work / '
    writes = [
        c.source.startswith(header)
        or (c.source.startswith(grown) and f"work / '{script}'" in c.source.partition('\n')[0])
        for c in code
    ]
    target = next((i for i, w in enumerate(writes) if w), None)
    if target is None:
        raise SystemExit(
            f'gpucheck script: {notebook.name} has no cell starting with '
            f'{header.strip()!r} or writing it with d2lpar.write_next; check the '
            'script name'
        )
    # A script written in parts: `%%writefile -a {work}/SCRIPT` cells add to it; the last one ends it.
    parts = [i for i, c in enumerate(code) if i > target and c.source.startswith(f'%%writefile -a {{work}}/{script}\n')]
    last = parts[-1] if parts else target
    nb.cells = [
        c
        for i, c in enumerate(code[: last + 1])
        if i in (0, target, *parts)
        or c.source.lstrip().startswith('#@save')
        or (code[target].source.startswith(grown) and c.source.startswith(('%%writefile', grown)))
    ]
    # Small: these cells only define and write; the script's own arguments set its size.
    env = dict(os.environ, TMPDIR=str(tmpdir), D2LPAR_SMALL='1')
    env.pop('MPLBACKEND', None)
    env.pop('PYTEST_CURRENT_TEST', None)
    client = NotebookClient(
        nb, timeout=600, kernel_name='python3', resources={'metadata': {'path': str(notebook.parent)}}
    )
    with client.setup_kernel(env=env, cwd=str(notebook.parent)):
        for index, cell in enumerate(nb.cells):
            try:
                client.execute_cell(cell, index)
            except CellExecutionError as e:
                raise SystemExit(
                    f'gpucheck script: preparing {script} from {notebook.name}: {e.ename}: {e.evalue}'
                ) from None
    written = sorted(Path(tmpdir).glob(f'*/{script}'))
    if len(written) != 1:
        raise SystemExit(
            f'gpucheck script: expected {notebook.name} to write one {script} '
            f'under {tmpdir}, found {[str(w) for w in written]}'
        )
    return written[0].parent


def run_script(argv):
    """`gpucheck.py script NOTEBOOK SCRIPT ...`: prepare, launch, check; return the exit status."""
    parser = argparse.ArgumentParser(
        prog='gpucheck.py script',
        description='Run a script as a notebook writes it (%%writefile {work}/SCRIPT) under '
        'torchrun, and check what its ranks hand back.',
    )
    parser.add_argument('notebook', type=Path)
    parser.add_argument('script', help='file name of the %%writefile cell, e.g. tp_block.py')
    parser.add_argument('--nproc', type=int, default=2)
    parser.add_argument('--backend', choices=['gloo', 'nccl'], default='nccl')
    parser.add_argument('--device', choices=['cpu', 'cuda'], default='cuda')
    parser.add_argument(
        '--scratch',
        type=Path,
        default=None,
        help='folder for the notebook\'s work folder and the results '
        '(default: a fresh temporary folder, removed at the end)',
    )
    parser.epilog = (
        'After --, the script\'s own arguments; {work} in them stands for the folder the notebook wrote the script in.'
    )
    ours, script_args = (argv[: argv.index('--')], argv[argv.index('--') + 1 :]) if '--' in argv else (argv, [])
    args = parser.parse_args(ours)
    args.args = script_args
    # gpucheck ends a row with SIGTERM: leave through `finally` (the kernel shut down, the
    # scratch folder removed); torchrun, in the same process group, gets it too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if not args.notebook.is_file():
        parser.error(f'no notebook {args.notebook}')
    if args.backend == 'nccl' or args.device == 'cuda':
        import d2lpar

        gpus = d2lpar.num_gpus()
        if args.nproc > gpus:
            parser.error(
                f'--nproc {args.nproc} with --backend nccl --device cuda needs one GPU '
                f'per rank, and CUDA can use {gpus} here'
                + (f' ({d2lpar.gpu_problem()})' if d2lpar.gpu_problem() else '')
                + f'; use --nproc {gpus}' * (gpus > 0)
                + ' or --backend gloo --device cpu'
            )
    own = args.scratch is None
    scratch = Path(tempfile.mkdtemp(prefix='d2lpar-gpucheck-script-')) if own else args.scratch
    try:
        tmpdir, results_dir = scratch / 'tmp', scratch / 'results'
        tmpdir.mkdir(parents=True)
        results_dir.mkdir()
        work = prepare_script(args.notebook, args.script, tmpdir)
        print(f'{args.notebook.name} wrote {work / args.script}', flush=True)
        env = dict(
            os.environ,
            TMPDIR=str(tmpdir),
            D2LPAR_RESULT_DIR=str(results_dir),
            PYTHONPATH=os.pathsep.join([str(work), str(ROOT)] + [p for p in [os.environ.get('PYTHONPATH')] if p]),
        )
        launch = _python(
            '-m',
            'torch.distributed.run',
            '--standalone',
            f'--nproc-per-node={args.nproc}',
            work / args.script,
            '--backend',
            args.backend,
            '--device',
            args.device,
            *(a.replace('{work}', str(work)) for a in args.args),
        )
        print('$', ' '.join(launch), flush=True)
        proc = subprocess.Popen(launch, cwd=work, env=env)
        try:
            code = proc.wait()
        finally:
            if proc.poll() is None:  # interrupted: torchrun ends its workers on SIGTERM only
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if code != 0:
            print(f'{args.script} exited with status {code}')
            return 1
        results = {}
        for f in sorted(results_dir.glob('*.json')):
            record = json.loads(f.read_text())
            results[record['rank']] = record
        try:
            _expect(
                sorted(results) == list(range(args.nproc)),
                f'results from ranks {sorted(results)}, expected 0-{args.nproc - 1}',
            )
            check = CHECKS.get(args.script)
            if check:
                check(results, args.args)
        except CheckFailed as e:
            print(f'{args.script}: check failed: {e}')
            return 1
        what = ' '.join(check.__doc__.split(':', 1)[-1].split()) if check else None
        print(
            f'{args.script} on {args.nproc} processes ({args.backend}, {args.device}): '
            + (f'checked: {what}' if check else 'every rank handed back its result')
        )
        return 0
    finally:
        if own:
            shutil.rmtree(scratch, ignore_errors=True)
