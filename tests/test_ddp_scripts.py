"""Notebook 5's training scripts: each a small diff of the last, all on one trajectory."""

import difflib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from d2lpar import num_gpus
from d2lpar import launch, launched_processes

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / 'notebooks' / 'scripts'
STEPS = ['train_single.py', 'ddp_spawn.py', 'ddp_torchrun.py', 'ddp_multinode.py']
SMALL = ['--epochs', '3', '--num-samples', '256', '--batch-size', '32']


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert launched_processes() == []


def test_every_script_opens_with_the_command_that_runs_it():
    for name in STEPS + [
        'ddp_restart.py',
        'debug_dist.py',
        'ddp_anatomy.py',
        'hello_dist.py',
        'ddp_standalone.py',
        'ddp_practice.py',
        'nccl_flight_recorder.py',
        'ddp_multinode.sbatch',
        'collectives_p2p.py',
        'collectives_timing.py',
        'collectives_miniddp.py',
    ]:
        path = SCRIPTS / name
        text = path.read_text().replace('\\\n', ' ')  # join continued lines
        run = [line for line in text.splitlines()[:4] if re.match(r'(# )?Run:  ', line)]
        assert run and path.name in run[0], f'{path.name} must open with its Run: command'


def test_each_step_is_a_small_diff_of_the_previous():
    # adding DDP is the big step; changing the launcher or the cluster is a small one
    for before, after, limit in zip(STEPS, STEPS[1:], [65, 30, 30]):
        a = (SCRIPTS / before).read_text().splitlines()
        b = (SCRIPTS / after).read_text().splitlines()
        changed = [
            line
            for line in difflib.unified_diff(a, b, lineterm='', n=0)
            if line[:1] in '+-' and not line.startswith(('+++', '---'))
        ]
        assert len(changed) <= limit, f'{before} -> {after}: {len(changed)} changed lines'
        assert len(changed) < len(b) < 90


def test_the_restart_script_is_a_small_diff_of_the_torchrun_one():
    a = (SCRIPTS / 'ddp_torchrun.py').read_text().splitlines()
    b = (SCRIPTS / 'ddp_restart.py').read_text().splitlines()
    changed = [
        line
        for line in difflib.unified_diff(a, b, lineterm='', n=0)
        if line[:1] in '+-' and not line.startswith(('+++', '---'))
    ]
    assert len(changed) <= 50 and len(b) < 90  # its own #@save cell imported, snapshots, prefix


SPAWN_FROM_MAIN = textwrap.dedent('''
    import torch.multiprocessing as mp

    def hello(rank):  # lives in __main__, which a spawned child cannot import (as in a notebook)
        print('hello from', rank)

    try:
        mp.spawn(hello, nprocs=1, join=True)
    except mp.ProcessExitedException as e:
        print('parent caught', type(e).__name__)
''')


def test_mp_spawn_cannot_run_a_function_defined_in_main():
    # What notebook 5 says about mp.spawn and notebook functions, with the real mp.spawn: the
    # child gets the function by name and cannot find it. Its stderr reaches this pipe.
    done = subprocess.run([sys.executable, '-c', SPAWN_FROM_MAIN], capture_output=True, text=True, timeout=120)
    assert 'parent caught ProcessExitedException' in done.stdout, done.stdout + done.stderr
    assert "Can't get attribute 'hello'" in done.stderr, done.stderr


def flat(values):
    return torch.tensor(values)


@pytest.fixture(scope='module')
def single():
    result = launch(
        SCRIPTS / 'train_single.py', nproc=1, args=SMALL, launcher='python', timeout=180, echo=False
    ).check()
    return result.by_rank()[0]


def test_torchrun_ddp_resumed_from_a_checkpoint_matches_one_process(single, tmp_path):
    ckpt = str(tmp_path / 'ckpt.pt')
    first = launch(
        SCRIPTS / 'ddp_torchrun.py', nproc=2, timeout=180, echo=False, args=[*SMALL, '--epochs', '2', '--ckpt', ckpt]
    ).check()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ckpt.pt']  # no temporary left
    state = torch.load(ckpt, weights_only=True)
    assert state['epoch'] == 1 and not any(k.startswith('module.') for k in state['net'])
    second = launch(
        SCRIPTS / 'ddp_torchrun.py', nproc=2, timeout=180, echo=False, args=[*SMALL, '--ckpt', ckpt, '--resume']
    ).check()
    runs = [first.by_rank(), second.by_rank()]
    for run in runs:
        assert sorted(run) == [0, 1] and all(r['replica_gap'] == 0 for r in run.values())
        torch.testing.assert_close(flat(run[0]['final']), flat(run[1]['final']), rtol=0, atol=0)
        # different initialisations, made identical (rank 0's) by DDP's constructor
        assert not torch.equal(flat(run[0]['init']), flat(run[1]['init']))
        assert torch.equal(flat(run[0]['synced']), flat(run[1]['synced']))
        assert torch.equal(flat(run[1]['synced']), flat(run[0]['init']))
    torch.testing.assert_close(flat(runs[0][0]['synced']), flat(single['init']))
    assert sorted(runs[0][0]['losses']) == ['0', '1'] and sorted(runs[1][0]['losses']) == ['2']
    losses = {**runs[0][0]['losses'], **runs[1][0]['losses']}
    for epoch, loss in single['losses'].items():
        assert loss == pytest.approx(losses[epoch], rel=1e-5)
    torch.testing.assert_close(flat(runs[1][0]['final']), flat(single['final']), rtol=1e-5, atol=1e-6)


def test_mp_spawn_with_a_file_init_method_matches_one_process(single, tmp_path):
    url = (tmp_path / 'rendezvous').as_uri()
    result = launch(
        SCRIPTS / 'ddp_spawn.py',
        nproc=1,
        launcher='python',
        timeout=180,
        echo=False,
        args=[*SMALL, '--nproc', '2', '--init-method', url],
    ).check()
    run = result.by_rank()
    shards = [set(run[r]['shard']) for r in (0, 1)]
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == 256
    torch.testing.assert_close(flat(run[1]['final']), flat(single['final']), rtol=1e-5, atol=1e-6)


def test_an_uneven_batch_is_refused_with_a_clear_message(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import common

    assert common.local_batch_size(32, 2) == 16
    with pytest.raises(SystemExit, match='does not split evenly over 2 processes'):
        common.local_batch_size(33, 2)


@pytest.mark.parametrize(
    'script,how',
    [
        ('ddp_spawn.py', dict(nproc=1, launcher='python', args=['--nproc', '2'])),
        ('ddp_torchrun.py', dict(nproc=2)),
        ('ddp_multinode.py', dict(nproc=2)),
    ],
)
def test_an_explicit_nccl_without_a_gpu_per_process_is_refused_clearly(script, how, tmp_path):
    # No GPU for anyone (the mask hides them all), so each rank must stop at
    # pick_backend's check, not at "invalid device ordinal" in torch.cuda.set_device.
    result = launch(
        SCRIPTS / script,
        nproc=how['nproc'],
        launcher=how.get('launcher', 'torchrun'),
        args=[*SMALL, *how.get('args', []), '--backend', 'nccl'],
        timeout=120,
        echo=False,
        env={'CUDA_VISIBLE_DEVICES': '', 'D2LPAR_BACKEND': None, 'TMPDIR': str(tmp_path)},
    )
    said = '\n'.join(line for lines in result.output.values() for line in lines)
    assert not result.ok and not result.timed_out
    assert 'backend nccl needs one GPU per process: 2 local process(es) but 0 usable' in said
    assert 'invalid device ordinal' not in said
    # mp.spawn keeps a file of each failed child's traceback: refused before any child starts
    assert not list(tmp_path.glob('pytorch-errorfile-*'))


def load_script(name):
    """Import a script of notebooks/scripts as a module, without running its main()."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f'script_{name[:-3]}', SCRIPTS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Joined(Exception):
    """Raised by the fake init_process_group: the test has seen what it needs."""


@pytest.mark.parametrize(
    'name,argv', [('hello_dist.py', []), ('ddp_anatomy.py', []), ('ddp_practice.py', ['--parts', 'accumulate'])]
)
def test_scripts_bind_the_gpu_and_join_nccl_with_device_id(monkeypatch, name, argv):
    # issue 24, defect 10: NCCL without device_id makes barrier() guess the GPU (and warn).
    # A 2-GPU machine is faked: torch's GPU count and NCCL, set_device and the group itself.
    import torch.distributed as dist

    import d2lpar.machinery.ranks

    monkeypatch.syspath_prepend(str(SCRIPTS))
    script = load_script(name)
    calls = []
    monkeypatch.setattr(d2lpar.machinery.ranks, 'num_gpus', lambda: 2)  # pick_backend's view
    monkeypatch.setattr(dist, 'is_nccl_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'set_device', lambda device: calls.append(('bind', device)))

    def init_process_group(backend, **kwargs):
        calls.append(('join', backend, kwargs.get('device_id')))
        raise Joined

    monkeypatch.setattr(dist, 'init_process_group', init_process_group)
    monkeypatch.setattr(sys, 'argv', [name, '--backend', 'nccl', *argv])
    for key, value in dict(
        RANK='1', LOCAL_RANK='1', WORLD_SIZE='2', LOCAL_WORLD_SIZE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT='29500'
    ).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(Joined):
        script.main()
    cuda1 = torch.device('cuda', 1)
    assert calls == [('bind', cuda1), ('join', 'nccl', cuda1)]  # bound first, then device_id


def test_compile_timing_waits_for_the_gpu(monkeypatch):
    # issue 24, defect 7: without a synchronize, the clock measures kernel launches only
    monkeypatch.syspath_prepend(str(SCRIPTS))
    script = load_script('ddp_practice.py')
    log = []
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda device=None: log.append('sync'))
    clock = iter(range(100))
    monkeypatch.setattr(script.time, 'perf_counter', lambda: (log.append('clock'), next(clock))[1])
    script.timed(lambda net: log.append('step'), None, torch.device('cuda', 0), 2)
    assert log == ['sync', 'clock', 'step', 'sync', 'clock'] * 2
    log.clear()
    script.timed(lambda net: log.append('step'), None, torch.device('cpu'), 1)
    assert log == ['clock', 'step', 'clock']  # nothing to wait for on the CPU


def test_every_dataloader_worker_loads_however_many_there_are():
    # issue 24, defect 2: a GPU server gives each rank many workers; the loader part must give
    # each of them batches to load (it used to have 5 batches per rank, whatever the workers)
    result = launch(
        SCRIPTS / 'ddp_practice.py', nproc=2, timeout=180, echo=False, args=['--parts', 'loader', '--workers', '6']
    ).check()
    for r in (0, 1):
        (loader,) = [x for x in result.results if x['rank'] == r and x.get('part') == 'loader']
        assert loader['workers'] == 6
        for epoch in loader['epochs']:
            assert len(epoch['pids']) == 6 and loader['pid'] not in epoch['pids']
        assert loader['epochs'][0]['pids'] == loader['epochs'][1]['pids']  # persistent


def test_an_edit_to_a_saved_cell_of_notebook_5_reaches_the_next_launch():
    # What runs is what the learner sees: in a real kernel, run notebook 5's cells up to the
    # mp.spawn run (the notebook itself shows its check passing), but first break make_loader
    # as a learner might (each rank seeds its own permutation) and run the edited cell: the
    # launch runs the edit, and the notebook's own check of the run fails.
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = ROOT / 'notebooks' / '05_ddp.ipynb'
    nb = nbformat.read(path, as_version=4)
    cells = nb.cells

    def find(text):
        (index,) = [i for i, c in enumerate(cells) if c.cell_type == 'code' and text in c.source]
        return index

    setup = [find('d2lpar.show_setup()'), find('d2lpar.save_cells(')]
    saved = [i for i, c in enumerate(cells) if c.source.lstrip().startswith('#@save')]
    single, spawn = find("launch('scripts/train_single.py'"), find("launch('scripts/ddp_spawn.py'")
    check = find("assert not shards[0] & shards[1]")
    loader = find('def make_loader(')
    cells.append(
        nbformat.v4.new_code_cell(
            "import shutil\n"
            "edited = 'seed + rank' in (work / 'ddp_steps.py').read_text()\n"
            "shutil.rmtree(work, ignore_errors=True)\nassert edited"
        )
    )
    client = NotebookClient(nb, timeout=600, resources={'metadata': {'path': str(path.parent)}})
    with client.setup_kernel():
        try:
            for i in setup + saved + [single]:
                client.execute_cell(cells[i], i)
            edited = cells[loader].source.replace('shuffle=True, seed=seed)', 'shuffle=True, seed=seed + rank)')
            assert edited != cells[loader].source
            cells[loader].source = edited
            client.execute_cell(cells[loader], loader)  # the learner reruns the edited cell
            client.execute_cell(cells[spawn], spawn)  # and the launch cell
            with pytest.raises(CellExecutionError, match='AssertionError'):
                client.execute_cell(cells[check], check)  # shards overlap, parameters differ
        finally:
            client.execute_cell(cells[-1], len(cells) - 1)  # the module held the edit; clean up


def test_the_standalone_script_imports_only_torch_and_trains_and_resumes_under_torchrun(tmp_path):
    import ast

    script = SCRIPTS / 'ddp_standalone.py'
    tree = ast.parse(script.read_text())
    imported = {
        alias.name.split('.')[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {node.module.split('.')[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {'argparse', 'os', 'sys', 'torch'}  # the standard library and torch, nothing else
    assert len(script.read_text().splitlines()) <= 70
    import os

    run_dir, scratch = tmp_path / 'run', tmp_path / 'tmp'
    run_dir.mkdir(), scratch.mkdir()

    def torchrun(epochs):  # plain torchrun, as a learner runs it: no d2lpar anywhere
        # TMPDIR: torchrun's own log folders (torchelastic_*) go where pytest cleans up
        env = dict(os.environ, OMP_NUM_THREADS='1', TMPDIR=str(scratch))
        env.pop('PYTHONPATH', None)
        return subprocess.run(
            [
                sys.executable,
                '-m',
                'torch.distributed.run',
                '--standalone',
                '--nproc-per-node=2',
                str(script),
                '--epochs',
                str(epochs),
                '--ckpt',
                'ckpt.pt',
            ],
            cwd=run_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    first = torchrun(2)
    assert first.returncode == 0, first.stderr[-2000:]
    assert re.findall(r'epoch (\d+): loss', first.stdout) == ['0', '1']
    state = torch.load(run_dir / 'ckpt.pt', weights_only=True)
    assert state['epoch'] == 1 and not any(k.startswith('module.') for k in state['net'])
    assert sorted(p.name for p in run_dir.iterdir()) == ['ckpt.pt']  # no temporary left
    again = torchrun(3)  # resumes after epoch 1: only epoch 2 is left
    assert again.returncode == 0, again.stderr[-2000:]
    assert re.findall(r'epoch (\d+): loss', again.stdout) == ['2']
    losses = [float(x) for x in re.findall(r'loss ([\d.]+)', first.stdout + again.stdout)]
    assert losses[-1] < losses[0]  # it learned


@pytest.mark.skipif(num_gpus() >= 2, reason='with 2 GPUs it runs (make gpucheck)')
def test_the_flight_recorder_script_says_it_needs_two_gpus(tmp_path):
    out = subprocess.run(
        [sys.executable, SCRIPTS / 'nccl_flight_recorder.py', '--dump-dir', tmp_path / 'fr'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and 'nccl_flight_recorder.py: needs 2 GPUs' in out.stderr
    assert not (tmp_path / 'fr').exists()  # nothing made before the refusal
