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


def test_synchronize_is_a_noop_without_cuda():
    devices.synchronize(torch.device('cpu'))
    devices.synchronize()


def test_small_workload(monkeypatch):
    monkeypatch.setenv('D2LPAR_SMALL', '1')
    assert d2lpar.small_workload()
    monkeypatch.setenv('D2LPAR_SMALL', '0')
    assert not d2lpar.small_workload()
    monkeypatch.delenv('D2LPAR_SMALL')
    assert not d2lpar.small_workload()
