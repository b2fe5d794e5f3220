"""Visibility masks: the pure-Python rules against torch's own parser, and masked children."""

import os
import time

import pytest
import torch

import d2lpar

MASKS = [
    '',
    '-1',
    '0',
    '1',
    '0,1',
    '1,0',
    '0,2,3',
    '0,5',
    '5,0',
    'abc',
    '0,0',
    '1,0,1',
    '0,2,-1,1',
    ' 1 , 0 ',
    '1gpu2,2ampere',
    '+1',
    '-0',
    '0,,1',
    '3,2,1,0',
    '0 1',
    'GPU-aa',
    'GPU-aa,GPU-bb',
    'GPU-aa,GPU-aa',
    'GPU-aa,1',
    'MIG-aa,MIG-bb',
    ' GPU-aa',
]
UUIDS4 = ['GPU-aa11', 'GPU-bb22', 'GPU-bc33', 'GPU-cc44']


def torch_parse(monkeypatch, mask):
    parse = getattr(torch.cuda, '_parse_visible_devices', None)
    if parse is None:
        pytest.skip('this torch has no torch.cuda._parse_visible_devices to compare with')
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', mask)
    return parse()


@pytest.mark.parametrize('mask', MASKS)
def test_parse_matches_torch(monkeypatch, mask):
    assert d2lpar.parse_visible_devices(mask) == torch_parse(monkeypatch, mask)


@pytest.mark.parametrize('num_gpus', [0, 1, 2, 4, 8])
@pytest.mark.parametrize('mask', [m for m in MASKS if not m.startswith('MIG-')])
def test_count_matches_torch(monkeypatch, mask, num_gpus):
    """torch's NVML-based count with the GPU count (and UUIDs) faked is the reference."""
    if not hasattr(torch.cuda, '_device_count_nvml'):
        pytest.skip('this torch has no torch.cuda._device_count_nvml to compare with')
    uuids = [f'GPU-{i:x}{i:x}{i}' for i in range(10, 10 + num_gpus)]  # GPU-aa10, GPU-bb11, ...
    monkeypatch.setattr(torch.cuda, '_raw_device_count_nvml', lambda: num_gpus)
    monkeypatch.setattr(torch.cuda, '_raw_device_uuid_nvml', lambda: uuids)
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', mask)
    assert len(d2lpar.visible_gpus(mask, num_gpus, uuids)) == torch.cuda._device_count_nvml()


@pytest.mark.parametrize(
    'mask,num_gpus,expected',
    [
        (None, 4, [0, 1, 2, 3]),
        (None, 0, []),
        ('', 4, []),
        ('-1', 4, []),
        ('abc', 4, []),
        ('0,0', 4, []),
        ('0,2,-1,1', 4, [0, 2]),
        ('1,0', 4, [1, 0]),
        ('0,2,3', 4, [0, 2, 3]),
        ('0,5', 8, [0, 5]),
        ('0,5', 4, [0]),
        ('5,0', 4, []),
        ('0, 5', 8, [0, 5]),
        ('3', 2, []),
        ('0,1', 0, []),
    ],
)
def test_visible_gpus_rules(mask, num_gpus, expected):
    assert d2lpar.visible_gpus(mask, num_gpus) == expected


@pytest.mark.parametrize(
    'mask,expected',
    [
        ('GPU-bc', [2]),  # a unique prefix is enough
        ('GPU-cc44,GPU-aa', [3, 0]),
        ('GPU-b', []),  # ambiguous: GPU-bb22 and GPU-bc33
        ('GPU-aa,GPU-b,GPU-cc', [0]),
        ('GPU-ff', []),
        ('GPU-aa,GPU-aa11', []),  # the same GPU twice
        ('MIG-aa', []),
    ],
)
def test_visible_gpus_uuids(mask, expected):
    assert d2lpar.visible_gpus(mask, 4, UUIDS4) == expected


def test_visible_gpus_bad_input():
    with pytest.raises(ValueError, match='uuids=') as err:
        d2lpar.visible_gpus('GPU-aa', 4)
    assert 'nvidia-smi -L' in str(err.value)
    with pytest.raises(ValueError, match='4 GPU'):
        d2lpar.visible_gpus('0', 4, UUIDS4[:3])
    with pytest.raises(TypeError, match='UUID strings'):
        d2lpar.visible_gpus('0', 1, 'GPU-aa')
    for bad in (-1, 2.0, '4', True, None):
        with pytest.raises(ValueError, match='num_gpus'):
            d2lpar.visible_gpus('0', bad)
    for bad in (0, [0, 1], b'0'):
        with pytest.raises(TypeError, match='string'):
            d2lpar.visible_gpus(bad, 4)


def test_choose_gpu(monkeypatch):
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    assert d2lpar.choose_gpu(1) == torch.device('cuda:1')
    assert d2lpar.choose_gpu() == torch.device('cuda:0')
    for bad in (2, -1):
        with pytest.raises(ValueError, match='indices 0 to 1') as err:
            d2lpar.choose_gpu(bad)
        assert f'GPU index {bad} does not exist' in str(err.value)
        assert 'CUDA_VISIBLE_DEVICES' not in str(err.value)
        assert ('try_gpu' in str(err.value)) == (bad >= 0)  # try_gpu(-1) is no fallback
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '0,5')
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES='0,5'"):
        d2lpar.choose_gpu(5)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 0)
    with pytest.raises(ValueError, match='sees no GPU.*try_gpu'):
        d2lpar.choose_gpu(0)
    for bad in ('1', 1.0, True, None):
        with pytest.raises(TypeError, match='int GPU index'):
            d2lpar.choose_gpu(bad)


def test_misspelled_cuda_vars():
    environ = {
        'CUDA_VISIBLE_DEVICE': '1',
        'cuda_visible_devices': '1',
        'CUDA_DEVICE_ODER': 'x',
        'CUDA_VISIBLE_DEVICES': '0',
        'CUDA_DEVICE_ORDER': 'PCI_BUS_ID',
        'NVIDIA_VISIBLE_DEVICES': 'all',
        'HIP_VISIBLE_DEVICES': '0',
        'CUDA_HOME': '/x',
        'PATH': '/bin',
        'CUDE_VISIBLE_DEVICES': '1',
        # other accelerators' real variables are not typos of CUDA's
        'XPU_VISIBLE_DEVICES': '0',
        'TPU_VISIBLE_DEVICES': '0',
        'MLU_VISIBLE_DEVICES': '0',
        'NPU_VISIBLE_DEVICES': '0',
        'GPU_DEVICE_ORDINAL': '0',
    }
    assert d2lpar.misspelled_cuda_vars(environ) == [
        'CUDA_DEVICE_ODER',
        'CUDA_VISIBLE_DEVICE',
        'CUDE_VISIBLE_DEVICES',
        'cuda_visible_devices',
    ]
    assert d2lpar.misspelled_cuda_vars({'CUDA_VISIBLE_DEVICES': ''}) == []


def test_run_with_masks_reports_what_each_child_saw(monkeypatch):
    gpus_here = d2lpar.num_gpus()
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', 'set-in-parent')
    monkeypatch.setenv('D2LPAR_TEST_UNSET_ME', 'x')
    code = (
        "import os, sys\n"
        "print('hello from', os.environ.get('CUDA_VISIBLE_DEVICES'), end='')\n"
        "print('to stderr', file=sys.stderr)\n"
        "report['who'] = os.environ.get('WHO')\n"
        "report['unset'] = 'D2LPAR_TEST_UNSET_ME' in os.environ\n"
    )
    masks = ['', None, '1,0']
    seen = d2lpar.run_with_masks(
        masks, code=code, env=[{'WHO': 'a'}, {'WHO': 'b', 'D2LPAR_TEST_UNSET_ME': None}, {'WHO': 'c'}]
    )
    assert [s['mask'] for s in seen] == masks  # the parent's own mask is not inherited
    assert [s['report'] for s in seen] == [
        {'who': 'a', 'unset': True},
        {'who': 'b', 'unset': False},
        {'who': 'c', 'unset': True},
    ]
    assert [s['stdout'] for s in seen] == ['hello from ', 'hello from None', 'hello from 1,0']
    assert all(s['stderr'] == 'to stderr\n' for s in seen)
    assert len({s['pid'] for s in seen} | {os.getpid()}) == 4
    for s, mask in zip(seen, masks):
        assert s['device_count'] == len(s['names']) == len(s['uuids'])
        assert s['env'].get('CUDA_VISIBLE_DEVICES') == mask
        assert s['seconds'] > 0
    assert seen[0]['device_count'] == 0 and not seen[0]['cuda_available']  # '' hides every GPU
    if gpus_here == 0:  # nothing to see whatever the mask
        assert all(s['device_count'] == 0 for s in seen)


def test_run_with_mask_script_and_concurrency(tmp_path):
    """Three children pass a file barrier, so all three were alive at once."""
    script = tmp_path / 'worker.py'
    script.write_text(
        "import os, pathlib, sys, time\n"
        "folder, n = pathlib.Path(sys.argv[1]), int(sys.argv[2])\n"
        "(folder / str(os.getpid())).touch()\n"
        "deadline = time.monotonic() + 60\n"
        "while len(list(folder.iterdir())) < n:\n"
        "    assert time.monotonic() < deadline, 'barrier timed out'\n"
        "    time.sleep(0.02)\n"
        "report['argv'] = sys.argv[1:]\n"
    )
    barrier = tmp_path / 'barrier'
    barrier.mkdir()
    seen = d2lpar.run_with_masks(['0', '1', '-1'], script=script, args=[str(barrier), '3'], max_parallel=3)
    assert [s['report']['argv'] for s in seen] == [[str(barrier), '3']] * 3
    assert sorted(p.name for p in barrier.iterdir()) == sorted(str(s['pid']) for s in seen)
    one = d2lpar.run_with_mask('0', script=str(script), args=[str(barrier), '3'])
    assert one['mask'] == '0' and one['report']['argv'][1] == '3'


def test_failing_child_relays_stderr():
    code = "import sys\nprint('partial output')\nraise ValueError('the child broke: 42')\n"
    with pytest.raises(RuntimeError, match=r"CUDA_VISIBLE_DEVICES '0'\) failed with exit code 1") as err:
        d2lpar.run_with_mask('0', code=code)
    assert "ValueError: the child broke: 42" in str(err.value)
    with pytest.raises(RuntimeError, match='without its report'):
        d2lpar.run_with_mask(None, code='import sys\nsys.exit(0)\n')


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie waiting for its new parent to reap it is dead too
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] == 'Z'
    except OSError:
        return True


@pytest.mark.skipif(os.name != 'posix', reason='checks process groups')
def test_timeout_kills_child_and_grandchild(tmp_path):
    pids = tmp_path / 'pids'
    code = (
        "import os, subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{g.pid}}')\n"
        "print('about to hang', file=sys.stderr, flush=True)\n"
        "time.sleep(120)\n"
    )
    tik = time.perf_counter()
    with pytest.raises(TimeoutError, match=r'within 3 s and was killed') as err:
        d2lpar.run_with_mask('', code=code, timeout=3)
    assert time.perf_counter() - tik < 20
    assert 'about to hang' in str(err.value)
    child, grandchild = map(int, pids.read_text().split())
    deadline = time.monotonic() + 10
    while not (_gone(child) and _gone(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child) and _gone(grandchild)


def test_run_with_masks_bad_input(tmp_path):
    with pytest.raises(TypeError, match='list of CUDA_VISIBLE_DEVICES'):
        d2lpar.run_with_masks('0,1')
    with pytest.raises(ValueError, match='empty'):
        d2lpar.run_with_masks([])
    with pytest.raises(TypeError, match='mask is a string'):
        d2lpar.run_with_masks([0])
    with pytest.raises(TypeError, match='mask is a string'):
        d2lpar.run_with_mask(1)
    with pytest.raises(ValueError, match='one per mask'):
        d2lpar.run_with_masks(['0', '1'], code=['pass'])
    with pytest.raises(TypeError, match='Python source'):
        d2lpar.run_with_mask('0', code=print)
    with pytest.raises(ValueError, match='not both'):
        d2lpar.run_with_mask('0', code='pass', script=__file__)
    with pytest.raises(FileNotFoundError, match='does not exist'):
        d2lpar.run_with_mask('0', script=tmp_path / 'missing.py')
    with pytest.raises(ValueError, match='mask argument'):
        d2lpar.run_with_mask(None, env={'CUDA_VISIBLE_DEVICES': '0'})
    with pytest.raises(TypeError, match='a string, a number or None'):
        d2lpar.run_with_mask('0', env={'OMP_NUM_THREADS': [1]})
    with pytest.raises(TypeError, match='dict'):
        d2lpar.run_with_masks(['0'], env=('OMP_NUM_THREADS=1',))
    with pytest.raises(TypeError, match='args'):
        d2lpar.run_with_mask('0', script=__file__, args='x')
    for bad in (0, -1, '5', True):
        with pytest.raises(ValueError, match='timeout'):
            d2lpar.run_with_mask('0', timeout=bad)
    with pytest.raises(ValueError, match='max_parallel'):
        d2lpar.run_with_masks(['0'], max_parallel=0)
    with pytest.raises(TypeError, match='single values'):
        d2lpar.run_with_mask('0', code=['pass'])


def _wait_for(path, seconds=60):
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f'{path} never appeared'
        time.sleep(0.05)


@pytest.mark.skipif(os.name != 'posix', reason='checks process groups')
def test_leftover_grandchild_is_killed(tmp_path):
    pid_file = tmp_path / 'pid'
    code = (
        "import subprocess, sys\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pid_file)!r}, 'w').write(str(g.pid))\n"
        "raise SystemExit(3)  # exits at once, leaving the grandchild behind\n"
    )
    with pytest.raises(RuntimeError, match='exit code 3'):
        d2lpar.run_with_mask(None, code=code)
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(grandchild)


@pytest.mark.skipif(os.name != 'posix', reason='sends SIGINT to this process')
def test_interrupt_kills_children(tmp_path):
    """A KeyboardInterrupt (the learner stopping the kernel) leaves no child behind."""
    import signal
    import threading

    pid_file = tmp_path / 'pid'
    code = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n"

    def interrupt():
        _wait_for(pid_file)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    tik = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        d2lpar.run_with_masks(['', '0'], code=code, max_parallel=1)
    assert time.perf_counter() - tik < 60
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child)


def test_a_child_whose_gpus_cannot_start_reports_none_and_does_not_crash():
    # What a driver too old for the build looks like from Python: NVML counts GPUs,
    # the CUDA runtime cannot start. The child's own report must not ask for them.
    too_old = (
        'import torch\n'
        'torch.cuda.device_count = lambda: 2\n'
        'torch.cuda.is_available = lambda: False\n'
        'report["num_gpus"] = __import__("d2lpar").num_gpus()\n'
    )
    seen = d2lpar.run_with_mask(None, code=too_old)
    assert seen['device_count'] == 0 and not seen['cuda_available'] and seen['names'] == []
    assert seen['report']['num_gpus'] == 0


def test_a_mask_set_after_is_available_fools_device_count_but_not_cuda(monkeypatch):
    """Notebook 2's trap, on torch's own device_count with the driver mocked.

    The CUDA runtime read CUDA_VISIBLE_DEVICES when is_available() initialised the driver: it
    keeps seeing 2 GPUs. Until torch has initialised CUDA, device_count() asks NVML and applies
    the variable as it is now; afterwards it asks the runtime.
    """
    import torch

    monkeypatch.setattr(torch.cuda, '_is_compiled', lambda: True)
    monkeypatch.setattr(torch._C, '_cuda_getDeviceCount', lambda: 2, raising=False)
    monkeypatch.setattr(torch.cuda, '_raw_device_count_nvml', lambda: 2)  # NVML: 2 GPUs in the box
    monkeypatch.setattr(torch.cuda, '_initialized', False)
    monkeypatch.setattr(torch.cuda, '_cached_device_count', None)
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')  # set too late: after is_available()
    assert torch.cuda.device_count() == 0  # follows the changed variable
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '1')
    assert torch.cuda.device_count() == 1
    monkeypatch.setattr(torch.cuda, '_initialized', True)  # the first CUDA tensor initialised torch
    assert torch.cuda.device_count() == 2  # now the runtime answers, with the mask it read first
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    assert torch.cuda.device_count() == 2  # and the answer is kept
