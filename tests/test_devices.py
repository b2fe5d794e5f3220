"""Device helpers on this machine, and with the GPU count faked."""

import pytest
import torch

import d2lpar
from d2lpar import devices


@pytest.fixture
def fake_gpus(monkeypatch):
    def set_count(n):
        monkeypatch.setattr(torch.cuda, 'device_count', lambda: n)
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: n > 0)

    return set_count


@pytest.fixture
def driver_too_old(monkeypatch):
    """NVML counts 2 GPUs, the CUDA runtime cannot start: what a too-old driver gives."""
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)

    def cannot_start(*args, **kwargs):
        raise RuntimeError('The NVIDIA driver on your system is too old')

    for name in ('get_device_name', 'get_device_properties', 'synchronize', 'init'):
        monkeypatch.setattr(torch.cuda, name, cannot_start)


def test_try_gpu_falls_back_to_cpu(fake_gpus):
    fake_gpus(0)
    assert d2lpar.try_gpu() == torch.device('cpu')
    assert d2lpar.try_gpu(-1) == torch.device('cpu')
    assert d2lpar.try_all_gpus() == [torch.device('cpu')]
    assert d2lpar.hardware_tier() == 'CPU only'


def test_try_gpu_with_gpus(fake_gpus):
    fake_gpus(2)
    assert d2lpar.try_gpu(1) == torch.device('cuda:1')
    assert d2lpar.try_gpu(2) == torch.device('cpu')
    assert d2lpar.try_gpu(-1) == torch.device('cpu')  # not cuda:-1
    assert d2lpar.try_all_gpus() == [torch.device('cuda:0'), torch.device('cuda:1')]
    assert d2lpar.hardware_tier() == '2 GPUs'


@pytest.mark.parametrize(
    'gpus,expected',
    [
        (0, ['cpu', 'cpu', 'cpu']),
        (1, ['cuda:0', 'cuda:0', 'cuda:0']),
        (2, ['cuda:0', 'cuda:1', 'cuda:0']),
        (4, ['cuda:0', 'cuda:1', 'cuda:2']),
    ],
)
def test_device_slots(fake_gpus, capsys, gpus, expected):
    fake_gpus(gpus)
    slots = d2lpar.device_slots(3)
    assert [str(d) for d in slots] == expected
    said = capsys.readouterr().out
    assert ('exact but not faster' in said) == (0 < gpus < 3)
    assert ('no GPU visible' in said) == (gpus == 0)


@pytest.mark.parametrize('bad', [0, -1, 2.0, '2', True])
def test_device_slots_bad_input(bad):
    with pytest.raises(ValueError, match='positive int'):
        d2lpar.device_slots(bad)


def test_synchronize_waits_for_the_device_given(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, 'synchronize', calls.append)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    devices.synchronize(torch.device('cpu'))
    devices.synchronize('cuda:1')
    assert calls == []  # no CUDA: nothing to wait for
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    devices.synchronize('cpu')
    assert calls == []  # CPU work is never queued
    devices.synchronize('cuda:1')
    devices.synchronize(torch.device('cuda', 0))
    assert calls == ['cuda:1', torch.device('cuda', 0)]


def test_synchronize_none_waits_for_every_gpu(monkeypatch):
    calls = []  # torch.cuda.synchronize(None) would wait for the current GPU only
    monkeypatch.setattr(torch.cuda, 'synchronize', calls.append)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 3)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_initialized', lambda: False)
    devices.synchronize()
    assert calls == []  # CUDA never started in this process: nothing is queued anywhere
    monkeypatch.setattr(torch.cuda, 'is_initialized', lambda: True)
    monkeypatch.delattr(torch._C, '_cuda_hasPrimaryContext', raising=False)
    devices.synchronize()
    assert calls == [0, 1, 2]
    calls.clear()
    # GPU 1 has no CUDA context: no work there, and synchronizing would create a context
    monkeypatch.setattr(torch._C, '_cuda_hasPrimaryContext', lambda i: i != 1, raising=False)
    devices.synchronize()
    assert calls == [0, 2]


def test_a_driver_too_old_for_torch_means_the_cpu_with_a_reason(driver_too_old, capsys):
    from d2lpar import distributed
    from d2lpar.machinery import info

    assert d2lpar.num_gpus() == 0
    assert d2lpar.try_gpu() == torch.device('cpu')
    assert d2lpar.try_all_gpus() == [torch.device('cpu')]
    assert d2lpar.hardware_tier() == 'CPU only'
    assert 'counts 2 GPU(s), but CUDA cannot start' in d2lpar.gpu_problem()
    assert d2lpar.device_slots(2) == [torch.device('cpu')] * 2
    d2lpar.synchronize()  # the patched torch.cuda.synchronize would raise
    d2lpar.Timer().stop()
    d2lpar.show_setup()  # every notebook's first cell: it asked get_device_name before
    said = capsys.readouterr().out
    assert said.count('counts 2 GPU(s), but CUDA cannot start') == 2  # slots, show_setup
    assert 'hardware tier: CPU only (no GPU visible)' in said
    assert 'no usable GPU: ' in said and 'driver is older than this torch build' in said
    report = info.report()
    assert 'GPUs              none visible' in report and 'GPU problem' in report
    with pytest.raises(ValueError, match='sees no GPU it can use .*CUDA cannot start'):
        d2lpar.choose_gpu(0)
    assert distributed.pick_backend(2) == 'gloo'
    with pytest.raises(ValueError, match='nccl needs one GPU per process: 2 local process.* but 0 usable GPU'):
        distributed.pick_backend(2, override='nccl')


def test_no_reason_printed_when_the_gpus_work_or_there_are_none(fake_gpus, capsys):
    for n in (0, 2):
        fake_gpus(n)
        assert d2lpar.gpu_problem() is None
        d2lpar.device_slots(2)
    assert 'cannot start' not in capsys.readouterr().out


def test_small_workload(monkeypatch):
    monkeypatch.setenv('D2LPAR_SMALL', '1')
    assert d2lpar.small_workload()
    monkeypatch.setenv('D2LPAR_SMALL', '0')
    assert not d2lpar.small_workload()
    monkeypatch.delenv('D2LPAR_SMALL')
    assert not d2lpar.small_workload()


@pytest.mark.parametrize('bad', ['0', None, 1.5, True])
def test_try_gpu_needs_an_int(bad):
    with pytest.raises(TypeError, match='int GPU index'):
        d2lpar.try_gpu(bad)


@pytest.mark.parametrize(
    'value,expected',
    [
        (None, False),
        ('', False),
        ('0', False),
        ('false', False),
        ('No', False),
        ('1', True),
        ('true', True),
        (' yes ', True),
        ('ON', True),
    ],
)
def test_env_flag(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv('D2LPAR_TEST_FLAG', raising=False)
    else:
        monkeypatch.setenv('D2LPAR_TEST_FLAG', value)
    assert d2lpar.env_flag('D2LPAR_TEST_FLAG') is expected


def test_env_flag_refuses_what_it_cannot_read(monkeypatch):
    monkeypatch.setenv('D2LPAR_SMALL', 'maybe')
    with pytest.raises(ValueError, match="D2LPAR_SMALL='maybe' is neither on nor off"):
        d2lpar.small_workload()
