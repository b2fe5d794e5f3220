"""d2lpar.distributed: ranks from torchrun's or SLURM's variables, backends, results."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import d2lpar
from d2lpar.distributed import (
    DistEnv,
    default_timeout,
    dist_env,
    emit_result,
    expand_nodelist,
    pick_backend,
    rank_device,
    torch_env_from_slurm,
)
from full_disk import run_on_a_full_disk

SBATCH = Path(__file__).resolve().parent.parent / 'notebooks' / 'scripts' / 'ddp_multinode.sbatch'


@pytest.mark.parametrize(
    'nodelist,hosts',
    [
        ('node07', ['node07']),
        ('node[03-05,07]', ['node03', 'node04', 'node05', 'node07']),
        ('gpu[8-10]', ['gpu8', 'gpu9', 'gpu10']),
        ('a[1-2],b[01-02]', ['a1', 'a2', 'b01', 'b02']),
        ('rack[1-2]-n[1,3]', ['rack1-n1', 'rack1-n3', 'rack2-n1', 'rack2-n3']),
        ('node[099-101]', ['node099', 'node100', 'node101']),
        ('cn-12.cluster,cn-[3]', ['cn-12.cluster', 'cn-3']),
        ('10.0.0.[1-2]', ['10.0.0.1', '10.0.0.2']),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize('bad', ['', 'node[1-', 'node]1', 'node[5-3]', 'node[a-b]', 'n[1-[2]]', 'a,,b', None, 7])
def test_expand_nodelist_rejects_bad_input(bad):
    with pytest.raises(ValueError, match='nodelist'):
        expand_nodelist(bad)


def slurm_task(procid, ntasks, localid, nodelist='node[03-05,07]', **extra):
    env = {
        'SLURM_PROCID': str(procid),
        'SLURM_NTASKS': str(ntasks),
        'SLURM_LOCALID': str(localid),
        'SLURM_NODELIST': nodelist,
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def test_slurm_variables_map_to_torchrun_names():
    mapped = torch_env_from_slurm(slurm_task(5, 8, 1, SLURM_NTASKS_PER_NODE=2), port=12345)
    assert mapped == {
        'RANK': '5',
        'WORLD_SIZE': '8',
        'LOCAL_RANK': '1',
        'LOCAL_WORLD_SIZE': '2',
        'MASTER_ADDR': 'node03',
        'MASTER_PORT': '12345',
    }
    env = dist_env(slurm_task(5, 8, 1, SLURM_NTASKS_PER_NODE=2))
    assert env == DistEnv(5, 1, 8, 2, 'node03', 29500, 'slurm')


def test_explicit_master_and_tasks_per_node_spec_win():
    task = slurm_task(3, 7, 0, MASTER_ADDR='head', MASTER_PORT=4000, SLURM_TASKS_PER_NODE='3(x2),1', SLURM_NODEID=2)
    mapped = torch_env_from_slurm(task)
    assert (mapped['MASTER_ADDR'], mapped['MASTER_PORT']) == ('head', '4000')
    assert mapped['LOCAL_WORLD_SIZE'] == '1'  # node 2 of '3,3,1' runs one task


def test_torchrun_variables_take_precedence_over_slurm():
    task = slurm_task(5, 8, 1)
    task.update(RANK='1', WORLD_SIZE='2', LOCAL_RANK='1', MASTER_ADDR='127.0.0.1', MASTER_PORT='29555')
    assert torch_env_from_slurm(task) == {}
    assert dist_env(task) == DistEnv(1, 1, 2, 2, '127.0.0.1', 29555, 'torchrun')


def test_no_launcher_means_a_world_of_one():
    assert dist_env({}) == DistEnv(0, 0, 1, 1, '127.0.0.1', 29500, 'single')


@pytest.mark.parametrize(
    'environ,message',
    [
        ({'RANK': '0'}, 'WORLD_SIZE'),
        ({'RANK': '2', 'WORLD_SIZE': '2'}, 'below'),
        ({'RANK': 'one', 'WORLD_SIZE': '2'}, 'not an integer'),
        ({'RANK': '0', 'WORLD_SIZE': '0'}, '>= 1'),
        ({'SLURM_PROCID': '0'}, 'srun'),
        ({'SLURM_PROCID': '4', 'SLURM_NTASKS': '4', 'SLURM_LOCALID': '0', 'SLURM_NODELIST': 'n1'}, 'below'),
    ],
)
def test_bad_environments_are_explained(environ, message):
    with pytest.raises(ValueError, match=message):
        dist_env(environ)


def test_sbatch_example_maps_every_task_to_a_distinct_rank():
    text = SBATCH.read_text()
    nodes = int(re.search(r'#SBATCH --nodes=(\d+)', text).group(1))
    per_node = int(re.search(r'#SBATCH --ntasks-per-node=(\d+)', text).group(1))
    assert re.search(r'^srun python scripts/ddp_multinode\.py', text, re.M)
    assert (SBATCH.parent / 'ddp_multinode.py').is_file()
    nodelist = f'gpu[03-{3 + nodes - 1:02d}]'
    hosts = expand_nodelist(nodelist)
    envs = []
    for procid in range(nodes * per_node):  # SLURM's default block distribution
        node = procid // per_node
        task = slurm_task(
            procid,
            nodes * per_node,
            procid % per_node,
            nodelist,
            SLURM_NODEID=node,
            SLURM_TASKS_PER_NODE=f'{per_node}(x{nodes})',
            MASTER_PORT=20000 + 4242 % 20000,
            SLURMD_NODENAME=hosts[node],
        )
        envs.append(dist_env(task))
    assert sorted(e.rank for e in envs) == list(range(nodes * per_node))
    assert {e.world_size for e in envs} == {nodes * per_node}
    assert [e.local_rank for e in envs] == list(range(per_node)) * nodes
    assert {e.local_world_size for e in envs} == {per_node}
    assert {(e.master_addr, e.master_port) for e in envs} == {('gpu03', 24242)}


def test_pick_backend(monkeypatch):
    monkeypatch.delenv('D2LPAR_BACKEND', raising=False)
    if d2lpar.num_gpus() == 0:
        assert pick_backend(2) == 'gloo'
        with pytest.raises(ValueError, match='one GPU per process'):
            pick_backend(2, override='nccl')
    assert pick_backend(d2lpar.num_gpus() + 1) == 'gloo'  # not a GPU for everyone
    assert pick_backend(1, override='gloo') == 'gloo'
    monkeypatch.setenv('D2LPAR_BACKEND', 'gloo')
    assert pick_backend(1) == 'gloo'
    with pytest.raises(ValueError, match='unknown backend'):
        pick_backend(1, override='ncl')


@pytest.mark.parametrize('gpus', [0, 1, 3])
def test_an_explicit_nccl_gets_the_same_check_as_the_automatic_choice(monkeypatch, gpus):
    import torch.distributed as dist

    monkeypatch.delenv('D2LPAR_BACKEND', raising=False)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: gpus)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: gpus > 0)
    monkeypatch.setattr(dist, 'is_nccl_available', lambda: True)
    monkeypatch.setattr(sys, 'platform', 'linux')
    for nproc in (1, 2, 3):
        enough = gpus >= nproc
        assert pick_backend(nproc) == ('nccl' if enough else 'gloo')
        for explicit in ({'override': 'nccl'}, {'env': 'nccl'}):  # --backend, D2LPAR_BACKEND
            if 'env' in explicit:
                monkeypatch.setenv('D2LPAR_BACKEND', 'nccl')
            try:
                if enough:
                    assert pick_backend(nproc, explicit.get('override')) == 'nccl'
                else:  # refused before a rank asks for a GPU it does not have
                    with pytest.raises(
                        ValueError, match=f'nccl needs one GPU per process: {nproc} local process.*{gpus} usable'
                    ):
                        pick_backend(nproc, explicit.get('override'))
            finally:
                monkeypatch.delenv('D2LPAR_BACKEND', raising=False)
    monkeypatch.setattr(dist, 'is_nccl_available', lambda: False)  # Windows, macOS, CPU builds
    if gpus:
        assert pick_backend(1) == 'gloo'
        with pytest.raises(ValueError, match='nccl is not built into this torch'):
            pick_backend(1, override='nccl')


def test_rank_device_and_timeout(monkeypatch):
    assert rank_device('gloo', 3) == torch.device('cpu')
    with pytest.raises(ValueError, match="unknown backend 'bogus'"):
        rank_device('bogus')
    monkeypatch.setenv('D2LPAR_DIST_TIMEOUT', '7.5')
    assert default_timeout().total_seconds() == 7.5
    assert default_timeout(3).total_seconds() == 3
    for bad in (0, -1, 'soon'):
        with pytest.raises(ValueError, match='timeout'):
            default_timeout(bad)


def test_emit_result_writes_json_files_or_prints_a_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv('RANK', '1')
    monkeypatch.delenv('D2LPAR_RESULT_DIR', raising=False)
    emit_result(loss=0.5, params=torch.arange(10.0))
    out = capsys.readouterr().out
    assert out.startswith('D2LPAR_RESULT ') and 'rank=1' in out and '<list of 10>' in out
    monkeypatch.setenv('D2LPAR_RESULT_DIR', str(tmp_path))
    emit_result({'loss': 0.25}, params=torch.ones(2))
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].name.startswith('1-') and files[0].suffix == '.json'
    assert json.loads(files[0].read_text()) == {'loss': 0.25, 'params': [1.0, 1.0], 'rank': 1}
    with pytest.raises(TypeError, match='emit_result cannot store a object'):
        emit_result(thing=object())
    assert [f.name for f in tmp_path.iterdir()] == [files[0].name]  # nothing half-written


def test_a_result_that_cannot_be_written_whole_leaves_no_file(tmp_path):
    # A disk that fills halfway through the write: the launcher must find no half record (it
    # reads every *.json) and no temporary file left behind.
    done = run_on_a_full_disk(f"""
        import os
        os.environ['D2LPAR_RESULT_DIR'] = {str(tmp_path)!r}
        from d2lpar.distributed import emit_result
        full_disk()
        try:
            emit_result(losses=list(range(1000)))
        except OSError as e:
            print('raised', e.errno)
        """)
    assert done.stdout.startswith('raised'), done.stderr
    assert list(tmp_path.iterdir()) == []


def test_exit_now_flushes_and_skips_the_teardown():
    # an atexit handler shows whether the interpreter's teardown ran
    code = (
        'import atexit, sys\nfrom d2lpar.distributed import exit_now\n'
        'atexit.register(lambda: print("teardown ran"))\n'
        'print("results", end=""); sys.stderr.write("warning")\nexit_now(3)\n'
    )
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (3, 'results', 'warning')


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='C stdio checked with glibc')
def test_exit_now_keeps_what_c_code_printed():
    # Without -u (as in mp.spawn's children) C stdout into a pipe is fully buffered.
    code = (
        'import ctypes\nfrom d2lpar.distributed import exit_now\n'
        'ctypes.CDLL(None).printf(b"NCCL INFO from C\\n")\nexit_now(0)\n'
    )
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONUNBUFFERED'}
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120, env=env)
    assert (done.returncode, done.stdout) == (0, 'NCCL INFO from C\n')
