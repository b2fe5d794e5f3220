"""Device helpers on this machine, and with the GPU count faked."""
import pytest
import torch

import d2lpar
from d2lpar import devices


@pytest.fixture
def fake_gpus(monkeypatch):
    def set_count(n):
        monkeypatch.setattr(torch.cuda, 'device_count', lambda: n)
    return set_count


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


@pytest.mark.parametrize('gpus,expected', [
    (0, ['cpu', 'cpu', 'cpu']),
    (1, ['cuda:0', 'cuda:0', 'cuda:0']),
    (2, ['cuda:0', 'cuda:1', 'cuda:0']),
    (4, ['cuda:0', 'cuda:1', 'cuda:2']),
])
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


def test_synchronize_waits_only_for_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, 'synchronize', calls.append)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    devices.synchronize(torch.device('cpu'))
    devices.synchronize()
    assert calls == []  # no CUDA: nothing to wait for
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    devices.synchronize('cpu')
    assert calls == []  # CPU work is never queued
    devices.synchronize('cuda:1')
    devices.synchronize()
    assert calls == ['cuda:1', None]


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


@pytest.mark.parametrize('value,expected', [(None, False), ('', False), ('0', False),
                                            ('false', False), ('No', False), ('1', True),
                                            ('true', True), (' yes ', True), ('ON', True)])
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
