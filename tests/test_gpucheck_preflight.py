"""make gpucheck's preflight (verify/gpucheck.py): the driver is asked before any row, and a GPU that
torch cannot use stops the run with the reason and the fix."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'verify'))
import gpucheck  # noqa: E402


FAKE_SMI = '''#!/bin/sh
case "$1" in
  -L) echo "GPU 0: Tesla T4 (UUID: GPU-1)"; echo "GPU 1: Tesla T4 (UUID: GPU-2)";;
  --query-gpu=compute_mode) echo Default; echo Default;;
  --query-gpu=*) echo 535.104.05; echo 535.104.05;;
  *) echo "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2 |";;
esac
'''


def _fake_driver(tmp_path):
    """A PATH whose nvidia-smi says what a hosted 2x T4 machine with a CUDA 12.2 driver says."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / 'nvidia-smi'
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    return dict(os.environ, PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}')


def test_the_driver_is_read_from_nvidia_smi_and_proc(tmp_path, monkeypatch):
    monkeypatch.setenv('PATH', _fake_driver(tmp_path)['PATH'])
    found = gpucheck.driver_gpus(proc=tmp_path / 'no-proc')
    assert (found['count'], found['version'], found['cuda'], found['exclusive']) == (2, '535.104.05', '12.2', False)
    proc = tmp_path / 'proc-gpus'  # /proc/driver/nvidia/gpus: a folder per GPU
    for bus in ('0000:17:00.0', '0000:65:00.0', '0000:ca:00.0'):
        (proc / bus).mkdir(parents=True)
    monkeypatch.setenv('PATH', str(tmp_path / 'empty'))  # no nvidia-smi at all
    assert gpucheck.driver_gpus(proc=proc)['count'] == 3


def test_gpus_the_driver_lists_but_torch_cannot_use_stop_gpucheck_with_the_reason_and_the_fix(tmp_path):
    """The hosted-T4 case: the driver runs CUDA 12.2, this torch needs a newer CUDA (or is a
    CPU build); here torch finds no GPU, exactly as it would there. Even --allow-cpu must not
    turn that into a green table."""
    import torch
    from d2lpar import num_gpus

    if num_gpus():
        pytest.skip('torch can use a GPU here: nothing to mock')
    for flags in ([], ['--allow-cpu']):
        done = subprocess.run(
            [sys.executable, gpucheck.__file__, '--quick', *flags, '--logs', str(tmp_path / 'logs')],
            env=_fake_driver(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert 'lists 2 GPU(s)' in done.stderr and 'can use none' in done.stderr
        assert 'runs CUDA up to 12.2' in done.stderr and 'Fix' in done.stderr
        if torch.version.cuda:  # this torch: built for a CUDA the fake driver is too old for
            assert f'built for CUDA {torch.version.cuda}' in done.stderr
        else:
            assert 'CPU-only build' in done.stderr
        assert not (tmp_path / 'logs').exists()  # no row ran


def test_preflight_names_each_reason_and_lets_only_usable_gpus_or_an_explicit_cpu_run_pass():
    t4 = dict(count=2, version='535.104.05', cuda='12.2', exclusive=False)
    none = dict(count=0, version=None, cuda=None, exclusive=False)
    assert gpucheck.preflight(t4, 2, '12.1', '2.15.0', None, False) == (0, None)
    status, message = gpucheck.preflight(t4, 0, '13.2', '2.15.0+cu132', None, False)
    assert status == 2 and 'built for CUDA 13.2' in message and 'up to 12.2' in message
    assert 'cannot start' in message and 'CUDA 12.2 or older' in message
    status, message = gpucheck.preflight(t4, 0, None, '2.15.0+cpu', None, True)
    assert status == 2 and 'CPU-only build' in message
    status, message = gpucheck.preflight(t4, 0, '12.1', '2.15.0', '', False)
    assert status == 2 and "CUDA_VISIBLE_DEVICES=''" in message
    assert gpucheck.preflight(none, 0, '13.2', '2.15.0', None, False)[0] == 3
    status, message = gpucheck.preflight(none, 0, '13.2', '2.15.0', None, True)
    assert status == 0 and 'verify no GPU path' in message


def test_script_refuses_more_nccl_ranks_than_gpus_before_starting_a_kernel(tmp_path):
    from d2lpar import num_gpus

    done = subprocess.run(
        [
            sys.executable,
            gpucheck.__file__,
            'script',
            'notebooks/12_tensor_parallel.ipynb',
            'tp_block.py',
            '--nproc',
            str(num_gpus() + 1),
            '--scratch',
            str(tmp_path / 's'),
        ],
        cwd=gpucheck.ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2 and 'needs one GPU per rank' in done.stderr
    assert not (tmp_path / 's').exists()
