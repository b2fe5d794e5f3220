"""Notebook 5's training scripts: each a small diff of the last, all on one trajectory."""
import difflib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from d2lpar.launch import launch, launched_processes

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / 'notebooks' / 'scripts'
STEPS = ['train_single.py', 'ddp_spawn.py', 'ddp_torchrun.py', 'ddp_multinode.py']
FAKE_SRUN = ROOT / 'tests' / 'scripts' / 'fake_srun.py'
SMALL = ['--epochs', '3', '--num-samples', '256', '--batch-size', '32']


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert launched_processes() == []


def test_every_script_opens_with_the_command_that_runs_it():
    for name in STEPS + ['ddp_restart.py', 'debug_dist.py', 'ddp_anatomy.py', 'hello_dist.py',
                         'ddp_multinode.sbatch',
                         'collectives_p2p.py', 'collectives_timing.py',
                         'collectives_miniddp.py']:
        path = SCRIPTS / name
        text = path.read_text().replace('\\\n', ' ')  # join continued lines
        run = [line for line in text.splitlines()[:4] if re.match(r'(# )?Run:  ', line)]
        assert run and path.name in run[0], f'{path.name} must open with its Run: command'


def test_each_step_is_a_small_diff_of_the_previous():
    # adding DDP is the big step; changing the launcher or the cluster is a small one
    for before, after, limit in zip(STEPS, STEPS[1:], [65, 30, 30]):
        a = (SCRIPTS / before).read_text().splitlines()
        b = (SCRIPTS / after).read_text().splitlines()
        changed = [line for line in difflib.unified_diff(a, b, lineterm='', n=0)
                   if line[:1] in '+-' and not line.startswith(('+++', '---'))]
        assert len(changed) <= limit, f'{before} -> {after}: {len(changed)} changed lines'
        assert len(changed) < len(b) < 90


def test_the_restart_script_is_a_small_diff_of_the_torchrun_one():
    a = (SCRIPTS / 'ddp_torchrun.py').read_text().splitlines()
    b = (SCRIPTS / 'ddp_restart.py').read_text().splitlines()
    changed = [line for line in difflib.unified_diff(a, b, lineterm='', n=0)
               if line[:1] in '+-' and not line.startswith(('+++', '---'))]
    assert len(changed) <= 45 and len(b) < 90


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
    done = subprocess.run([sys.executable, '-c', SPAWN_FROM_MAIN], capture_output=True,
                          text=True, timeout=120)
    assert 'parent caught ProcessExitedException' in done.stdout, done.stdout + done.stderr
    assert "Can't get attribute 'hello'" in done.stderr, done.stderr


def flat(values):
    return torch.tensor(values)


@pytest.fixture(scope='module')
def single():
    result = launch(SCRIPTS / 'train_single.py', nproc=1, args=SMALL, launcher='python',
                    timeout=180, echo=False).check()
    return result.by_rank()[0]


def test_torchrun_ddp_resumed_from_a_checkpoint_matches_one_process(single, tmp_path):
    ckpt = str(tmp_path / 'ckpt.pt')
    first = launch(SCRIPTS / 'ddp_torchrun.py', nproc=2, timeout=180, echo=False,
                   args=[*SMALL, '--epochs', '2', '--ckpt', ckpt]).check()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ckpt.pt']  # no temporary left
    state = torch.load(ckpt, weights_only=True)
    assert state['epoch'] == 1 and not any(k.startswith('module.') for k in state['net'])
    second = launch(SCRIPTS / 'ddp_torchrun.py', nproc=2, timeout=180, echo=False,
                    args=[*SMALL, '--ckpt', ckpt, '--resume']).check()
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
    torch.testing.assert_close(flat(runs[1][0]['final']), flat(single['final']),
                               rtol=1e-5, atol=1e-6)


def test_mp_spawn_with_a_file_init_method_matches_one_process(single, tmp_path):
    url = (tmp_path / 'rendezvous').as_uri()
    result = launch(SCRIPTS / 'ddp_spawn.py', nproc=1, launcher='python', timeout=180,
                    echo=False, args=[*SMALL, '--nproc', '2', '--init-method', url]).check()
    run = result.by_rank()
    shards = [set(run[r]['shard']) for r in (0, 1)]
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == 256
    torch.testing.assert_close(flat(run[1]['final']), flat(single['final']),
                               rtol=1e-5, atol=1e-6)


def test_multinode_script_under_a_fake_srun_maps_slurm_variables(single):
    result = launch(FAKE_SRUN, nproc=1, launcher='python', timeout=180, echo=False,
                    args=['--ntasks', '2', '--nodelist', 'localhost,node[2-3]',
                          str(SCRIPTS / 'ddp_multinode.py'), *SMALL]).check()
    run = result.by_rank()
    assert sorted(run) == [0, 1]
    assert {r['source'] for r in run.values()} == {'slurm'}
    assert {r['master_addr'] for r in run.values()} == {'localhost'}
    assert [run[r]['local_rank'] for r in (0, 1)] == [0, 1]
    torch.testing.assert_close(flat(run[0]['final']), flat(single['final']),
                               rtol=1e-5, atol=1e-6)


def test_an_uneven_batch_is_refused_with_a_clear_message(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import common
    assert common.local_batch_size(32, 2) == 16
    with pytest.raises(SystemExit, match='does not split evenly over 2 processes'):
        common.local_batch_size(33, 2)


@pytest.mark.parametrize('script,how', [
    ('ddp_spawn.py', dict(nproc=1, launcher='python', args=['--nproc', '2'])),
    ('ddp_torchrun.py', dict(nproc=2)),
    ('ddp_multinode.py', dict(nproc=2)),
])
def test_an_explicit_nccl_without_a_gpu_per_process_is_refused_clearly(script, how):
    # No GPU for anyone (the mask hides them all), so each rank must stop at
    # pick_backend's check, not at "invalid device ordinal" in torch.cuda.set_device.
    result = launch(SCRIPTS / script, nproc=how['nproc'], launcher=how.get('launcher', 'torchrun'),
                    args=[*SMALL, *how.get('args', []), '--backend', 'nccl'], timeout=120,
                    echo=False, env={'CUDA_VISIBLE_DEVICES': '', 'D2LPAR_BACKEND': None})
    said = '\n'.join(line for lines in result.output.values() for line in lines)
    assert not result.ok and not result.timed_out
    assert 'backend nccl needs one GPU per process: 2 local process(es) but 0 usable' in said
    assert 'invalid device ordinal' not in said
