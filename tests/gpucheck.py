"""Verify the course on a machine with GPUs, in one command, without editing any file.

    make gpucheck                                    # every row this machine can run
    make gpucheck GPUCHECK_FLAGS="--rows 05,nccl"    # rows whose name contains 05 or nccl
    python tests/gpucheck.py --list                  # the rows, and how many GPUs each needs

Each row is one check: a notebook executed at full size in its folder (as a learner runs
it, D2LPAR_SMALL=0), or a GPU-only run that no notebook makes on every machine (NCCL, float16
with GradScaler, compression hooks, inductor, FSDP2, tensor and pipeline parallelism,
restarts, the flight recorder). A row that needs more GPUs than CUDA can use here is marked
`SKIPPED (needs N GPUs)`, so on a laptop the command runs what it can, and one GPU runs every
row that does not need two. The end is one table (row, result, seconds) under the machine's
GPU facts; each row's output goes to build/gpucheck/ROW.log. Exit status 1 when a row failed.
Every row together takes about 30 minutes on two GPUs; `--rows` runs it in parts.

A script that a notebook writes with `%%writefile {work}/NAME.py` (notebooks 10-13) is run
by a row of its own, which is also a command:

    python tests/gpucheck.py script notebooks/12_tensor_parallel.ipynb tp_block.py \
        --nproc 2 --backend nccl --device cuda -- --steps 20

It runs the notebook's first code cell, its `#@save` cells and that `%%writefile` cell in a
kernel (nothing else: the rest is the notebook row's to check), with TMPDIR in a scratch
folder so that the notebook's work folder lands there; launches the script written there with
torchrun (PYTHONPATH work:ROOT, as the notebook's launch has it); and checks what the ranks
handed back with the facts the notebook asserts after its own launch.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
SCRIPTS = NOTEBOOKS / 'scripts'


@dataclass
class Row:
    """One check: `notebook` executed at full size, or `argv` run from notebooks/."""
    name: str
    needs: int = 0  # GPUs that CUDA must be able to use
    notebook: Path = None
    argv: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    timeout: int = 1800  # seconds for the whole row


def _python(*args):
    return [sys.executable, *map(str, args)]


def _torchrun(nproc, script, *args):
    return _python('-m', 'torch.distributed.run', '--standalone', f'--nproc-per-node={nproc}',
                   SCRIPTS / script, *args)


def _script_row(name, notebook, script, nproc, scratch, *args):
    """A row that runs `script` as `notebook` writes it, on `nproc` GPUs with NCCL."""
    folder = scratch / script.removesuffix('.py')
    return Row(f'nccl {notebook} {script}: {name}', nproc,
               argv=_python(__file__, 'script', NOTEBOOKS / f'{notebook}.ipynb', script,
                            '--nproc', nproc, '--backend', 'nccl', '--device', 'cuda',
                            '--scratch', folder, '--', *args))


def rows(scratch):
    """Return every row, notebooks first, in course order; `scratch` holds per-row files."""
    table = [Row(f'notebook {p.stem}', notebook=p)
             for p in sorted(NOTEBOOKS.glob('[0-9][0-9]_*.ipynb'))]
    table += [
        Row('nccl ddp: torchrun, 2 processes, one GPU each', 2,
            argv=_torchrun(2, 'ddp_torchrun.py', '--backend', 'nccl', '--epochs', '4')),
        Row('nccl ddp: mp.spawn, 2 processes', 2,
            argv=_python(SCRIPTS / 'ddp_spawn.py', '--nproc', '2', '--backend', 'nccl')),
        Row('nccl hello with NCCL_DEBUG=INFO', 2, env={'NCCL_DEBUG': 'INFO'},
            argv=_torchrun(2, 'hello_dist.py', '--backend', 'nccl')),
        Row('nccl SyncBatchNorm and DDP arguments (ddp_anatomy)', 2,
            argv=_torchrun(2, 'ddp_anatomy.py', '--backend', 'nccl')),
        Row('nccl fp16 GradScaler, fp16 compression hook, inductor compile, profiler', 2,
            argv=_torchrun(2, 'ddp_practice.py', '--backend', 'nccl', '--parts', 'all',
                           '--trace-dir', scratch / 'trace', '--compile-backend', 'inductor')),
        Row('nccl restart: a rank fails, resumed from a fresh snapshot', 2,
            argv=_python('-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2',
                         '--max-restarts=1', SCRIPTS / 'ddp_restart.py', '--backend', 'nccl',
                         '--snapshot', scratch / 'snapshot.pt', '--fail-at-epoch', '1')),
        Row('nccl standalone DDP script (imports only torch)', 2,
            argv=_torchrun(2, 'ddp_standalone.py', '--epochs', '3', '--ckpt', scratch / 's.pt')),
        Row('nccl mini-DDP (hooks, buckets, overlap)', 2, env={'PYTHONPATH': str(ROOT)},
            argv=_torchrun(2, 'collectives_miniddp.py', '--variant', 'hook', 'buckets',
                           'overlap', '--buckets', '0.25', 'inf', '--check-steps', '3',
                           '--time-steps', '10')),
        Row('nccl context_parallel against full attention', 2,
            argv=_torchrun(2, 'context_parallel_torch.py')),
        Row('nccl flight recorder: a skipped collective, dumped and read by fr_trace', 2,
            argv=_python(SCRIPTS / 'nccl_flight_recorder.py', '--dump-dir', scratch / 'fr')),
        # The scripts notebooks 10-13 write, with the notebook's own arguments at full size.
        _script_row('ZeRO by hand', '10_zero', 'train_zero.py', 2, scratch,
                    '--width', '256', '--layers', '6'),
        _script_row('FSDP2, checkpoint', '11_fsdp2', 'train_fsdp2.py', 2, scratch,
                    '{work}/checkpoint'),
        _script_row('Megatron, sequence parallel', '12_tensor_parallel',
                    'tp_block.py', 2, scratch, '--steps', '20'),
        _script_row('DTensor plans, loss_parallel', '12_tensor_parallel',
                    'tp_dtensor.py', 2, scratch),
        _script_row('five schedules', '13_pipeline_parallel', 'pp_schedules.py', 2,
                    scratch, '--microbatches', '8', '--ms', '20', '--batch', '32'),
        _script_row('pp x FSDP2 x tp', '13_pipeline_parallel',
                    'parallel_3d.py', 8, scratch, '--steps', '10'),
        Row('pytest: the tests that need two GPUs', 2,
            argv=_python('-m', 'pytest', '-q', '-p', 'no:xdist', '-rs',
                         ROOT / 'tests/test_dataparallel.py', ROOT / 'tests/test_pipeline.py',
                         '-k', 'on_gpus or two_gpus')),
        Row('mask: notebook 02 under CUDA_VISIBLE_DEVICES=1,0', 2,
            notebook=NOTEBOOKS / '02_visible_devices.ipynb', env={'CUDA_VISIBLE_DEVICES': '1,0'}),
        Row('one GPU visible: notebook 05 under CUDA_VISIBLE_DEVICES=0', 1,
            notebook=NOTEBOOKS / '05_ddp.ipynb', env={'CUDA_VISIBLE_DEVICES': '0'}),
    ]
    return table


class CheckFailed(Exception):
    """What the ranks of a script handed back is not what its notebook asserts."""


def _expect(ok, what):
    if not ok:
        raise CheckFailed(what)


def _check_tp_block(results, args):
    """Notebook 12's facts after tp_block.py: equal to one process, four all-reduces."""
    for rank, r in results.items():
        for name in ('megatron', 'sp'):
            worst = max(r[name]['out'], r[name]['x_grad'], r[name]['grads'])
            _expect(worst < 1e-5, f'rank {rank}: {name} differs from one process by {worst:.1e}')
        _expect(r['sp']['partial'] > 0.1, f'rank {rank}: a norm gradient before the sum equals '
                'the whole one (the ranks did not see different tokens)')
        calls = {k: c for k, (c, _) in r['megatron']['calls'].items()}
        _expect(calls == {'all_reduce': 4}, f'rank {rank}: Megatron collectives {calls}')
        _expect(r['overlap_equal'], f'rank {rank}: overlapped backward changed the gradients')


def _check_tp_dtensor(results, args):
    """Notebook 12's facts after tp_dtensor.py: DTensor plans = Megatron by hand = one process."""
    for rank, r in results.items():
        lp = r['loss_parallel']
        diffs = [r['tp']['diff'], r['sp']['diff'], lp['grads'], abs(lp['loss'] - lp['want'])]
        _expect(max(diffs) < 1e-5, f'rank {rank}: differences {diffs}')
        _expect(r['tp']['collectives'] == {'all_reduce': 6},
                f"rank {rank}: tensor-parallel collectives {r['tp']['collectives']}")
        _expect(r['sp']['collectives'] == {'all_gather_into_tensor': 4,
                                           'reduce_scatter_tensor': 4},
                f"rank {rank}: sequence-parallel collectives {r['sp']['collectives']}")


def _one_process_pp(batch):
    """Notebook 13's reference: its network and batch trained unsplit; (loss, flat gradients)."""
    import torch
    from torch import nn
    torch.manual_seed(0)  # the script's make_net(): Linear-ReLU pairs, then a Linear
    layers = [nn.Linear(64, 32), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(32, 10))
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
    loss = nn.functional.cross_entropy(net(X), y)
    loss.backward()
    return loss.item(), [x for q in net.parameters() for x in q.grad.flatten().tolist()]


def _check_pp_schedules(results, args):
    """Notebook 13's facts after pp_schedules.py: every schedule = one process, in-flight peaks."""
    p = len(results)
    batch = int(args[args.index('--batch') + 1]) if '--batch' in args else 32
    want_loss, want = _one_process_pp(batch)
    m = sum(1 for e in results[0]['GPipe']['events'] if e[2] == 'F' and e[0] == 0)
    for name in [k for k, v in results[0].items() if isinstance(v, dict)]:  # the schedules
        by_stage = {i: g for r in results.values() for i, g in r[name]['grads'].items()}
        got = [x for i in sorted(by_stage, key=int) for t in by_stage[i] for x in _flatten(t)]
        _expect(len(got) == len(want) and max(abs(x - y) for x, y in zip(got, want)) < 1e-5,
                f'{name}: gradients differ from one process\'s')
        losses = [r[name]['loss'] for r in results.values() if r[name]['loss'] is not None]
        _expect(len(losses) == 1 and abs(losses[0] - want_loss) < 1e-5,
                f'{name}: last-stage losses {losses}, one process {want_loss:.5f}')
        _expect(all(r[name]['alive_after'] == 0 for r in results.values()),
                f'{name}: activations still held after the step')
    peaks = {name: [results[r][name]['peak_in_flight'] for r in range(p)] for name in ('GPipe', '1F1B')}
    _expect(peaks['GPipe'] == [m] * p, f'GPipe holds {peaks["GPipe"]} micro-batches, not {m}')
    _expect(peaks['1F1B'] == [p - r for r in range(p)], f'1F1B holds {peaks["1F1B"]}')


def _check_parallel_3d(results, args):
    """Notebook 13's facts after parallel_3d.py: 3D = one process within rounding."""
    r = results[0]
    sizes = r['sizes']
    tolerance = sizes['LR'] * r['steps'] * sizes['B'] * sizes['T'] * sizes['H'] * 2.0 ** -23
    _expect(sorted((r['pp'], r['dp'], r['tp']) for r in results.values()) ==
            [(a, b, c) for a in range(2) for b in range(2) for c in range(2)], 'mesh coordinates')
    for rank, r in results.items():
        _expect(r['max_diff'] < tolerance < r['moved'] / 100,
                f"rank {rank}: off by {r['max_diff']:.1e}, tolerance {tolerance:.1e}, "
                f"moved {r['moved']:.1e}")
    rows = [results[rank]['mlp0_rows'] for rank in range(4)]
    _expect(rows == [[0, 8], [16, 24], [8, 16], [24, 32]], f'mlp.0 rows held {rows}')


def _flatten(value):
    if isinstance(value, list):
        return [x for v in value for x in _flatten(v)]
    return [value]


# What each script's notebook asserts after launching it (the scripts of notebooks 10 and 11
# are checked by their exit status and one result per rank).
CHECKS = {'tp_block.py': _check_tp_block, 'tp_dtensor.py': _check_tp_dtensor,
          'pp_schedules.py': _check_pp_schedules, 'parallel_3d.py': _check_parallel_3d}


def prepare_script(notebook, script, tmpdir):
    """Write `script` as `notebook` does; return the notebook's work folder under `tmpdir`.

    Runs the notebook's first code cell (which makes `work` with tempfile.mkdtemp and calls
    save_cells), its `#@save` cells and the cell `%%writefile {work}/SCRIPT`, in that order.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = Path(notebook).resolve()
    nb = nbformat.read(notebook, as_version=4)
    code = [c for c in nb.cells if c.cell_type == 'code']
    header = f'%%writefile {{work}}/{script}\n'
    target = next((i for i, c in enumerate(code) if c.source.startswith(header)), None)
    if target is None:
        raise SystemExit(f'gpucheck script: {notebook.name} has no cell starting with '
                         f'{header.strip()!r}; check the script name')
    nb.cells = [c for i, c in enumerate(code[:target + 1])
                if i in (0, target) or c.source.lstrip().startswith('#@save')]
    # Small: these cells only define and write; the script's own arguments set its size.
    env = dict(os.environ, TMPDIR=str(tmpdir), D2LPAR_SMALL='1')
    env.pop('MPLBACKEND', None)
    env.pop('PYTEST_CURRENT_TEST', None)
    client = NotebookClient(nb, timeout=600, kernel_name='python3',
                            resources={'metadata': {'path': str(notebook.parent)}})
    with client.setup_kernel(env=env, cwd=str(notebook.parent)):
        for index, cell in enumerate(nb.cells):
            try:
                client.execute_cell(cell, index)
            except CellExecutionError as e:
                raise SystemExit(f'gpucheck script: preparing {script} from {notebook.name}: '
                                 f'{e.ename}: {e.evalue}') from None
    written = sorted(Path(tmpdir).glob(f'*/{script}'))
    if len(written) != 1:
        raise SystemExit(f'gpucheck script: expected {notebook.name} to write one {script} '
                         f'under {tmpdir}, found {[str(w) for w in written]}')
    return written[0].parent


def run_script(argv):
    """`gpucheck.py script NOTEBOOK SCRIPT ...`: prepare, launch, check; return the exit status."""
    parser = argparse.ArgumentParser(
        prog='gpucheck.py script',
        description='Run a script as a notebook writes it (%%writefile {work}/SCRIPT) under '
                    'torchrun, and check what its ranks hand back.')
    parser.add_argument('notebook', type=Path)
    parser.add_argument('script', help='file name of the %%writefile cell, e.g. tp_block.py')
    parser.add_argument('--nproc', type=int, default=2)
    parser.add_argument('--backend', choices=['gloo', 'nccl'], default='nccl')
    parser.add_argument('--device', choices=['cpu', 'cuda'], default='cuda')
    parser.add_argument('--scratch', type=Path, default=None,
                        help='folder for the notebook\'s work folder and the results '
                             '(default: a fresh temporary folder, removed at the end)')
    parser.epilog = ('After --, the script\'s own arguments; {work} in them stands for the folder '
                     'the notebook wrote the script in.')
    ours, script_args = (argv[:argv.index('--')], argv[argv.index('--') + 1:]) if '--' in argv \
        else (argv, [])
    args = parser.parse_args(ours)
    args.args = script_args
    # gpucheck ends a row with SIGTERM: leave through `finally` (the kernel shut down, the
    # scratch folder removed); torchrun, in the same process group, gets it too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if not args.notebook.is_file():
        parser.error(f'no notebook {args.notebook}')
    own = args.scratch is None
    scratch = Path(tempfile.mkdtemp(prefix='d2lpar-gpucheck-script-')) if own else args.scratch
    try:
        tmpdir, results_dir = scratch / 'tmp', scratch / 'results'
        tmpdir.mkdir(parents=True)
        results_dir.mkdir()
        work = prepare_script(args.notebook, args.script, tmpdir)
        print(f'{args.notebook.name} wrote {work / args.script}', flush=True)
        env = dict(os.environ, TMPDIR=str(tmpdir), D2LPAR_RESULT_DIR=str(results_dir),
                   PYTHONPATH=os.pathsep.join([str(work), str(ROOT)] + [
                       p for p in [os.environ.get('PYTHONPATH')] if p]))
        launch = _python('-m', 'torch.distributed.run', '--standalone',
                         f'--nproc-per-node={args.nproc}', work / args.script,
                         '--backend', args.backend, '--device', args.device,
                         *(a.replace('{work}', str(work)) for a in args.args))
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
            _expect(sorted(results) == list(range(args.nproc)),
                    f'results from ranks {sorted(results)}, expected 0-{args.nproc - 1}')
            check = CHECKS.get(args.script)
            if check:
                check(results, args.args)
        except CheckFailed as e:
            print(f'{args.script}: check failed: {e}')
            return 1
        print(f'{args.script} on {args.nproc} processes ({args.backend}, {args.device}): '
              + ('checked: ' + check.__doc__.split(':', 1)[1].strip() if check
                 else 'every rank handed back its result'))
        return 0
    finally:
        if own:
            shutil.rmtree(scratch, ignore_errors=True)


def gpu_facts():
    """Return lines describing the GPUs, the driver and the torch, CUDA and NCCL builds."""
    import torch
    import d2lpar
    lines = [f'torch {torch.__version__}, CUDA {torch.version.cuda or "none"}, '
             f'NCCL {".".join(map(str, torch.cuda.nccl.version())) if d2lpar.num_gpus() else "-"}']
    for i in range(d2lpar.num_gpus()):
        props = torch.cuda.get_device_properties(i)
        lines.append(f'cuda:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB')
    try:
        driver = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                                capture_output=True, text=True, timeout=60).stdout.split()
        lines.append(f'driver {driver[0]}' if driver else 'driver: nvidia-smi listed no GPU')
    except (OSError, subprocess.TimeoutExpired):
        lines.append('driver: nvidia-smi not found')
    problem = d2lpar.gpu_problem()
    lines.append(f'GPUs CUDA can use: {d2lpar.num_gpus()}' + (f' ({problem})' if problem else ''))
    return lines


def _end(proc):
    """End `proc`'s session: SIGTERM first (torchrun then stops its workers), then SIGKILL."""
    from d2lpar.processes import end_processes, launched_processes
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    end_processes(launched_processes())  # ranks of a d2lpar.launch inside a notebook row


def run_row(row, log):
    """Run one row, writing its output to `log`; return (ok, seconds, note)."""
    env = dict(os.environ, **row.env)
    env.pop('D2LPAR_SMALL', None)  # full size, as a learner runs it
    start = time.perf_counter()
    if row.notebook is not None:
        # A child process, so that a row's CUDA_VISIBLE_DEVICES applies before CUDA starts.
        code = ('import sys; from d2lpar.render import execute_notebook; '
                'nb, setup, s, error = execute_notebook(sys.argv[1], timeout=int(sys.argv[2])); '
                'print(setup); print(error or "ok"); sys.exit(1 if error else 0)')
        argv = _python('-c', code, row.notebook, row.timeout)
    else:
        argv = row.argv
    with open(log, 'w') as out:
        # In a session of its own, so that a timeout or Ctrl-C ends the row's whole tree.
        proc = subprocess.Popen(argv, cwd=NOTEBOOKS, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=row.timeout)
            ok, note = proc.returncode == 0, f'exit {proc.returncode}'
        except subprocess.TimeoutExpired:
            ok, note = False, f'timed out after {row.timeout} s'
        finally:
            _end(proc)
    seconds = time.perf_counter() - start
    if not ok:
        tail = log.read_text(errors='replace').strip().splitlines()[-1:] or ['']
        note = f'{note}: {tail[0][:100]}'
    return ok, seconds, note


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ['script']:
        return run_script(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rows', default='', help='comma-separated parts of row names to run')
    parser.add_argument('--list', action='store_true', help='list the rows and exit')
    parser.add_argument('--logs', default=str(ROOT / 'build' / 'gpucheck'),
                        help='folder for each row\'s output (default build/gpucheck)')
    args = parser.parse_args(argv)
    import d2lpar
    # Files rows write (snapshots) go to a fresh folder, removed at the end: every run
    # starts from nothing, so a restart row really restarts.
    scratch = Path(tempfile.gettempdir()) / f'd2lpar-gpucheck-{os.getpid()}'
    table = rows(scratch)
    wanted = [w.strip() for w in args.rows.split(',') if w.strip()]
    if wanted:
        table = [r for r in table if any(w in r.name for w in wanted)]
        if not table:
            parser.error(f'--rows {args.rows!r} matches no row; see --list')
    if args.list:
        for row in table:
            print(f'{row.needs} GPU(s)  {row.name}')
        return 0
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    scratch.mkdir()
    gpus = d2lpar.num_gpus()
    results = []
    try:
        for k, row in enumerate(table):
            if row.needs > gpus:
                results.append((row.name, f'SKIPPED (needs {row.needs} GPUs)', None))
                continue
            print(f'[{k + 1}/{len(table)}] {row.name} ...', flush=True)
            log = logs / (''.join(c if c.isalnum() else '_' for c in row.name)[:60] + '.log')
            ok, seconds, note = run_row(row, log)
            results.append((row.name, 'PASS' if ok else f'FAIL ({note}; see {log})', seconds))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print('\n' + '\n'.join(gpu_facts()) + '\n')
    width = max(len(name) for name, _, _ in results)
    for name, result, seconds in results:
        print(f'{name:{width}}  {"" if seconds is None else f"{seconds:6.0f} s"}  {result}')
    failed = sum(r.startswith('FAIL') for _, r, _ in results)
    ran = sum(s is not None for _, _, s in results)
    print(f'\n{ran - failed} passed, {failed} failed, {len(results) - ran} skipped')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
