"""Notebook 2's "set it too late" cells, run against children that see fake GPUs.

The children import a stand-in `torch` that follows torch.cuda's counting rules
(torch/cuda/__init__.py: `is_available` asks the CUDA runtime, whose driver reads
CUDA_VISIBLE_DEVICES once; `device_count` asks NVML with the variable as it is now
until CUDA has started, and caches once it has). Torch 2.13 and 2.15 then ask the
runtime; torch 2.11, which ran the course's only GPU check so far (one H200), still
asks NVML, and there notebook 2's old `late['device_count'] == n_gpus` failed.
"""

import json
import os
import tempfile
import textwrap
from pathlib import Path

import pytest

import d2lpar

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / 'notebooks' / '02_visible_devices.ipynb'

FAKE_TORCH = '''
import os

__version__ = os.environ['FAKE_TORCH_VERSION']
_threads = int(os.environ.get('OMP_NUM_THREADS') or 4)  # libgomp reads it when torch loads


def get_num_threads():
    return _threads


class _Tensor:
    def __init__(self, device):
        self.device = device

    def __matmul__(self, other):
        return _Tensor(self.device)


def device(name):
    return name


def ones(*size, device='cpu'):
    if str(device).startswith('cuda'):
        cuda._lazy_init()
        index = int(str(device).partition(':')[2] or 0)
        if index >= cuda._runtime_count():
            raise RuntimeError('CUDA error: invalid device ordinal')
        return _Tensor(f'cuda:{index}')
    return _Tensor('cpu')


randn = ones
from . import cuda  # noqa: E402
'''

FAKE_CUDA = '''
import fcntl
import os
import time
import types

_GPUS = int(os.environ['FAKE_GPUS'])
_major_minor = tuple(int(p) for p in os.environ['FAKE_TORCH_VERSION'].split('.')[:2])
_ASKS_RUNTIME_ONCE_STARTED = _major_minor >= (2, 13)
_initialized = False
_cached_device_count = None
_driver_gpus = None


def _visible(mask):
    """Ordinals a mask shows: entries up to the first invalid one (GPU-... names a UUID prefix)."""
    if mask is None:
        return list(range(_GPUS))
    shown = []
    for entry in mask.split(','):
        entry = entry.strip()
        if entry.startswith('GPU-'):
            hits = [i for i in range(_GPUS) if f'{i:08d}-0000-0000-0000-000000000000'.startswith(entry[4:].lower())]
            if len(hits) != 1:
                break
            entry = str(hits[0])
        if not entry.isdigit() or int(entry) >= _GPUS:
            break
        if int(entry) in shown:
            return []
        shown.append(int(entry))
    return shown


def _runtime_count():
    """cudaGetDeviceCount: the driver reads the variable once, at its first call."""
    global _driver_gpus
    if _driver_gpus is None:
        _driver_gpus = _visible(os.environ.get('CUDA_VISIBLE_DEVICES'))
    return len(_driver_gpus)


def is_available():
    return _runtime_count() > 0


def _lazy_init():
    global _initialized
    if not _initialized:
        if _runtime_count() == 0:
            raise RuntimeError('No CUDA GPUs are available')
        first = _driver_gpus[0]
        if str(first) in os.environ.get('FAKE_EXCLUSIVE', '').split(','):  # one process at a time
            global _context
            _context = open(os.path.join(os.environ['FAKE_LOCKS'], str(first)), 'a')
            try:
                fcntl.flock(_context, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until the process exits
            except BlockingIOError:
                raise RuntimeError('CUDA error: CUDA-capable device(s) is/are busy or unavailable') from None
            _context.write(f'{os.getpid()}\\n')
            _context.flush()
            time.sleep(float(os.environ.get('FAKE_HOLD', 0)))  # a start that takes a while
        _initialized = True


init = _lazy_init


def device_count():
    global _cached_device_count
    if _cached_device_count is not None:
        return _cached_device_count
    if _initialized and _ASKS_RUNTIME_ONCE_STARTED:
        r = _runtime_count()
    else:  # _device_count_nvml: NVML, with the variable as it is now
        r = len(_visible(os.environ.get('CUDA_VISIBLE_DEVICES')))
    if _initialized:
        _cached_device_count = r
    return r


def get_device_properties(device):
    _lazy_init()
    if isinstance(device, str):  # 'cuda:1', as a tensor's device prints
        device = int(device.partition(':')[2] or 0)
    if not 0 <= device < device_count():
        raise AssertionError('Invalid device id')
    physical = _driver_gpus[device]
    return types.SimpleNamespace(name='Fake GPU', uuid=f'{physical:08d}-0000-0000-0000-000000000000')
'''


def cell(cell_id):
    nb = json.loads(NOTEBOOK.read_text())
    (source,) = [''.join(c['source']) for c in nb['cells'] if c.get('id') == cell_id]
    return source


BASE, LATE_CHILDREN, TRAP_CHECK, SIDE_BY_SIDE = '8db1ab0e', 'fb521fca', '1416098a', '27b9efbc'
PREDICTIONS = 'cd78ec29'


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """Return set(gpus, version): children started after it import the stand-in torch."""
    package = tmp_path / 'fake' / 'torch'
    package.mkdir(parents=True)
    (package / '__init__.py').write_text(FAKE_TORCH)
    (package / 'cuda.py').write_text(FAKE_CUDA)
    path = os.environ.get('PYTHONPATH')
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join([str(tmp_path / 'fake'), *([path] if path else [])]))

    def set_(gpus, version):
        monkeypatch.setenv('FAKE_GPUS', str(gpus))
        monkeypatch.setenv('FAKE_TORCH_VERSION', version)

    return set_


def run_cells(*cell_ids):
    namespace = {'d2lpar': d2lpar, 'textwrap': textwrap, 'tempfile': tempfile, 'processes': 3}
    for cell_id in cell_ids:
        exec(compile(cell(cell_id), f'<notebook 2, cell {cell_id}>', 'exec'), namespace)
    return namespace


@pytest.mark.parametrize('version', ['2.11.0+cu130', '2.13.0', '2.15.0'])
@pytest.mark.parametrize('gpus', [0, 1, 2])
def test_the_late_mask_cells_hold_on_any_gpu_count_and_release(fake_gpus, gpus, version):
    fake_gpus(gpus, version)
    seen = run_cells(BASE, LATE_CHILDREN, TRAP_CHECK)
    assert seen['n_gpus'] == gpus  # the children really saw the fake GPUs
    assert seen['late']['cuda_available'] == (gpus > 0)
    if gpus:
        assert seen['trapped']['report']['tensor_on'] == 'cuda:0'


@pytest.mark.parametrize(('version', 'fails'), [('2.11.0+cu130', True), ('2.13.0', False), ('2.15.0', False)])
def test_the_old_check_fails_on_one_gpu_where_the_h200_run_failed(fake_gpus, version, fails):
    """The check the H200 run (torch 2.11) failed: the late child's count after CUDA started."""
    fake_gpus(1, version)
    seen = run_cells(BASE, LATE_CHILDREN)
    old_check = "assert late['device_count'] == n_gpus"
    if fails:
        with pytest.raises(AssertionError):
            exec(old_check, seen)
    else:
        exec(old_check, seen)


def test_a_mask_honoured_late_fails_the_late_check(fake_gpus, monkeypatch):
    """The check can fail: a driver that re-read the variable would hide the GPU from the late child."""
    fake_gpus(1, '2.15.0')
    source = FAKE_CUDA.replace('    if _driver_gpus is None:\n', '    if True:\n')
    assert source != FAKE_CUDA
    package = Path(os.environ['PYTHONPATH'].split(os.pathsep)[0]) / 'torch'
    (package / 'cuda.py').write_text(source)
    with pytest.raises(AssertionError, match='set after is_available'):
        run_cells(BASE, LATE_CHILDREN)


def exclusive_mode(gpus, tmp_path, monkeypatch):
    """Put every fake GPU in EXCLUSIVE_PROCESS mode: nvidia-smi says so, and CUDA's start takes a lock."""
    locks, bin_ = tmp_path / 'locks', tmp_path / 'bin'
    locks.mkdir()
    bin_.mkdir()
    uuids = [f'{i:08d}-0000-0000-0000-000000000000' for i in range(gpus)]
    smi = bin_ / 'nvidia-smi'
    smi.write_text('#!/bin/sh\n' + ''.join(f'echo "GPU-{u}, Exclusive_Process"\n' for u in uuids))
    smi.chmod(0o755)
    monkeypatch.setenv('PATH', f'{bin_}{os.pathsep}{os.environ["PATH"]}')
    monkeypatch.setenv('FAKE_EXCLUSIVE', ','.join(map(str, range(gpus))))
    monkeypatch.setenv('FAKE_LOCKS', str(locks))
    return uuids


@pytest.mark.parametrize('gpus', [1, 2])
@pytest.mark.skipif(os.name != 'posix', reason='the stand-in nvidia-smi is a shell script')
def test_processes_never_share_a_gpu_in_exclusive_process_mode(fake_gpus, tmp_path, monkeypatch, gpus, capsys):
    """Issue 34: sharing GPU 0 fails there; the cell says so and runs one process per GPU."""
    fake_gpus(gpus, '2.15.0')
    uuids = exclusive_mode(gpus, tmp_path, monkeypatch)
    locks = tmp_path / 'locks'
    assert d2lpar.exclusive_gpus() == uuids
    run_cells(BASE, SIDE_BY_SIDE)
    assert 'EXCLUSIVE_PROCESS' in capsys.readouterr().out
    users = {p.name: len(p.read_text().split()) for p in locks.iterdir()}
    assert users == {str(i): 2 if i == 0 else 1 for i in range(gpus)}  # the report's child, then one each


@pytest.mark.skipif(os.name != 'posix', reason='the stand-in nvidia-smi is a shell script')
def test_children_that_start_cuda_take_turns_in_exclusive_process_mode(fake_gpus, tmp_path, monkeypatch):
    """Even if CUDA's start alone claims the GPU (the stand-in assumes it), cells 6 and 10 pass there."""
    fake_gpus(1, '2.15.0')
    exclusive_mode(1, tmp_path, monkeypatch)
    monkeypatch.setenv('FAKE_HOLD', '0.5')  # each start holds the GPU a while: turns are needed
    turns = 'max_parallel=1 if exclusive else None'
    # cell 6 less the child that imports d2lpar, which needs the real torch
    predictions = cell(PREDICTIONS).replace("code=[CHOOSE_5 if m == '0,5' else None for m in masks]", 'code=None')
    late = cell(LATE_CHILDREN)
    assert predictions.count(turns) == late.count(turns) == 1

    def run(*sources):
        namespace = run_cells(BASE)
        for i, source in enumerate(sources):
            exec(compile(source, f'<notebook 2, part {i}>', 'exec'), namespace)

    run(predictions, late, cell(TRAP_CHECK))
    for all_at_once in (
        [predictions.replace(turns, 'max_parallel=len(masks)')],
        [predictions, late.replace(turns, 'max_parallel=4')],
    ):
        with pytest.raises(RuntimeError, match='busy or unavailable'):  # more than one child starts CUDA
            run(*all_at_once)


@pytest.mark.skipif(os.name != 'posix', reason='the stand-in nvidia-smi is a shell script')
def test_exclusive_gpus_reads_the_compute_mode_of_each_gpu(tmp_path):
    smi = tmp_path / 'nvidia-smi'
    smi.write_text('#!/bin/sh\necho "GPU-AB12-34, Default"\necho "GPU-cd56-78, Exclusive_Process"\n')
    smi.chmod(0o755)
    assert d2lpar.exclusive_gpus(str(smi)) == ['cd56-78']
    assert d2lpar.exclusive_gpus(str(tmp_path / 'missing')) == []
