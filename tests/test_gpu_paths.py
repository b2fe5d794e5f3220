"""The GPU paths that can be checked on a CPU: a mocked CUDA, gloo groups started as NCCL
would be, the rings' pairing of sends and receives (issue 34)."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from d2lpar import collectives as C
from d2lpar.distributed import count_calls, pick_backend

ROOT = Path(__file__).resolve().parent.parent


def _gpus(monkeypatch, count, usable):
    """CUDA as torch reports it with `count` GPUs that CUDA can (or cannot) start on."""
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: count)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: usable)
    monkeypatch.setattr(dist, 'is_nccl_available', lambda: True)
    monkeypatch.setattr(sys, 'platform', 'linux')
    monkeypatch.delenv('D2LPAR_BACKEND', raising=False)


def test_under_slurm_a_task_that_sees_one_gpu_of_its_node_is_warned_not_silently_on_cpu(monkeypatch):
    _gpus(monkeypatch, 1, True)
    monkeypatch.setenv('SLURM_JOB_ID', '42')
    with pytest.warns(UserWarning, match='one GPU bound per task'):
        assert pick_backend(2) == 'gloo'
    monkeypatch.delenv('SLURM_JOB_ID')  # a laptop with one GPU and 2 processes: expected, quiet
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert pick_backend(2) == 'gloo'
        monkeypatch.setenv('SLURM_JOB_ID', '42')
        assert pick_backend(1) == 'nccl'  # enough GPUs: nothing to say


def test_the_standalone_script_picks_gloo_where_cuda_cannot_start(tmp_path):
    """nvidia-smi's GPUs but a driver too old for this torch: device_count() 2, no CUDA."""
    shim = tmp_path / 'sitecustomize.py'  # runs in the torchrun ranks before the script
    shim.write_text('import torch\ntorch.cuda.device_count = lambda: 2\ntorch.cuda.is_available = lambda: False\n')
    env = dict(os.environ, PYTHONPATH=str(tmp_path), OMP_NUM_THREADS='1', TMPDIR=str(tmp_path))
    done = subprocess.run(
        [
            sys.executable,
            '-m',
            'torch.distributed.run',
            '--standalone',
            '--nproc-per-node=2',
            str(ROOT / 'notebooks/scripts/ddp_standalone.py'),
            '--epochs',
            '1',
            '--ckpt',
            str(tmp_path / 'c.pt'),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'epoch 0: loss' in done.stdout and '(2 processes, gloo)' in done.stdout


def _ring_worker(rank, world_size, port, out):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    try:
        from d2lpar.expert_parallel import pairwise_all_to_all

        posted = []
        real = dist.batch_isend_irecv

        def batch(ops):  # what each step hands to the backend at once
            posted.append(sorted((op.op.__name__, op.peer) for op in ops))
            return real(ops)

        dist.batch_isend_irecv = batch
        try:
            with count_calls() as calls:
                X = torch.arange(12.0) + 100 * rank
                C.ring_allreduce(X)
                outs = [torch.empty(2) for _ in range(world_size)]
                pairwise_all_to_all(outs, [torch.full((2,), 10.0 * rank + j) for j in range(world_size)])
        finally:
            dist.batch_isend_irecv = real
        torch.save({'X': X, 'outs': outs, 'posted': posted, 'calls': calls}, f'{out}/{rank}.pt')
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize('world_size', [2, 3])
def test_every_ring_step_and_exchange_posts_its_send_and_receive_as_one_batch(tmp_path, world_size):
    """NCCL may hang on an isend followed by a blocking recv to the same peer (2 ranks) unless
    both are grouped: each step must hand exactly one isend and one irecv to the backend at
    once, and count_calls must still count them."""
    from d2lpar import free_port

    torch.multiprocessing.spawn(_ring_worker, args=(world_size, free_port(), str(tmp_path)), nprocs=world_size)
    n = world_size
    for rank in range(n):
        got = torch.load(tmp_path / f'{rank}.pt', weights_only=True)
        want = sum(torch.arange(12.0) + 100 * r for r in range(n))
        assert torch.equal(got['X'], want)
        assert [o.tolist() for o in got['outs']] == [[10.0 * j + rank] * 2 for j in range(n)]
        ring = [[('irecv', (rank - 1) % n), ('isend', (rank + 1) % n)]] * (2 * (n - 1))
        a2a = [sorted([('irecv', (rank - s) % n), ('isend', (rank + s) % n)]) for s in range(1, n)]
        assert got['posted'] == ring + a2a
        calls = got['calls']
        assert calls['isend']['calls'] == calls['irecv']['calls'] == 2 * (n - 1) + (n - 1)
        assert calls['send']['calls'] == calls['recv']['calls'] == 0


def _timings_worker(rank, world_size, port, out):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    try:
        seen = []
        real = dist.all_reduce

        def all_reduce(tensor, *args, **kwargs):  # NCCL would refuse anything off its GPU
            seen.append(tensor.device.type)
            return real(tensor, *args, **kwargs)

        dist.all_reduce = all_reduce
        dist.get_backend = lambda group=None: 'nccl'  # as a group started with 'nccl'
        torch.cuda.current_device = lambda: 0
        placed = []
        real_zeros, real_tensor = torch.zeros, torch.tensor

        def zeros(*args, device=None, **kwargs):
            placed.append(str(device))
            return real_zeros(*args, **kwargs)  # the CPU stands in for cuda:0

        def tensor(*args, device=None, **kwargs):
            placed.append(str(device))
            return real_tensor(*args, **kwargs)

        torch.zeros, torch.tensor = zeros, tensor
        import d2lpar.helpers.timings

        d2lpar.helpers.timings.synchronize = lambda device: placed.append(f'sync {device}')
        try:
            C.allreduce_timings([64], repeats=1, max_iters=1)
        finally:
            torch.zeros, torch.tensor, dist.all_reduce = real_zeros, real_tensor, real
        with open(f'{out}/{rank}.txt', 'w') as f:
            f.write(' '.join(placed))
    finally:
        dist.destroy_process_group()


def test_allreduce_timings_puts_its_tensors_on_the_gpu_of_an_nccl_group(tmp_path):
    from d2lpar import free_port

    torch.multiprocessing.spawn(_timings_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    placed = (tmp_path / '0.txt').read_text().split(' ')
    assert placed[0] == 'cuda:0'  # the message
    assert {p for p in placed if not p.startswith('sync') and p != 'cuda:0'} == set(), placed
    assert 'sync cuda:0' in ' '.join(placed)  # the clock read after the GPU finished


def _p2p_script_worker(rank, world_size, port, out):
    import runpy

    os.environ.update(
        MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank)
    )
    posted = []
    real = dist.batch_isend_irecv

    def batch(ops):  # what the script hands to the backend at once
        posted.append(sorted((op.op.__name__, op.peer) for op in ops))
        return real(ops)

    dist.batch_isend_irecv = batch
    try:
        with count_calls(('send', 'recv', 'isend', 'irecv')) as calls:
            runpy.run_path(str(ROOT / 'notebooks' / 'scripts' / 'collectives_p2p.py'), run_name='__main__')
    finally:
        dist.batch_isend_irecv = real
    torch.save({'posted': posted, 'calls': calls}, f'{out}/{rank}.pt')


@pytest.mark.parametrize('world_size', [2, 3])
def test_the_p2p_script_posts_its_ring_exchange_as_one_batch(tmp_path, world_size):
    """Part 4 of notebook 9's collectives_p2p.py: its isend and irecv (to the same peer with
    2 ranks) go to the backend as one batch, as NCCL requires; no isend or irecv outside one."""
    from d2lpar.machinery.ports import free_port

    torch.multiprocessing.spawn(_p2p_script_worker, args=(world_size, free_port(), str(tmp_path)), nprocs=world_size)
    n = world_size
    for rank in range(n):
        got = torch.load(tmp_path / f'{rank}.pt', weights_only=True)
        assert got['posted'] == [[('irecv', (rank - 1) % n), ('isend', (rank + 1) % n)]], got['posted']
        calls = got['calls']
        assert calls['isend']['calls'] == calls['irecv']['calls'] == 1, calls  # each inside the batch
