"""The parallel primitives, checked against plain PyTorch references."""

import pytest
import torch

import d2lpar

CPU = torch.device('cpu')


def test_get_params_copies_on_the_same_device():
    params = [torch.randn(3, 2), torch.zeros(2)]
    replicas = [d2lpar.get_params(params, CPU) for _ in range(2)]
    for replica in replicas:
        for p, q in zip(params, replica):
            torch.testing.assert_close(q, p, rtol=0, atol=0)
            assert q.requires_grad and q.is_leaf
            assert q.data_ptr() != p.data_ptr()
    # Gradients of one replica never reach the other or the source.
    replicas[0][0].sum().backward()
    assert replicas[1][0].grad is None and params[0].grad is None
    with torch.no_grad():
        replicas[0][0].add_(1)
    assert not torch.equal(replicas[0][0], replicas[1][0])


def test_get_params_bad_input():
    with pytest.raises(TypeError, match='list of tensors'):
        d2lpar.get_params(torch.ones(2), CPU)
    with pytest.raises(TypeError, match=r'params\[1\]'):
        d2lpar.get_params([torch.ones(2), 3.0], CPU)


@pytest.mark.parametrize('rows,k', [(8, 2), (9, 2), (10, 4), (3, 3), (7, 1)])
def test_scatter_matches_torch_chunk(rows, k):
    X = torch.arange(rows * 3).reshape(rows, 3)
    parts = d2lpar.scatter(X, [CPU] * k)
    expected = torch.chunk(X, k)
    assert len(parts) == k == len(expected)
    for part, ref in zip(parts, expected):
        torch.testing.assert_close(part, ref, rtol=0, atol=0)
    torch.testing.assert_close(torch.cat(parts), X, rtol=0, atol=0)


def test_scatter_refuses_to_leave_a_device_idle():
    with pytest.raises(ValueError, match='2 rows cannot be split across 3'):
        d2lpar.scatter(torch.ones(2, 1), [CPU] * 3)
    # torch.chunk makes 2+2+1 from 5 rows: only 3 parts for 4 devices.
    with pytest.raises(ValueError, match='only 3 parts for 4 devices'):
        d2lpar.scatter(torch.ones(5, 1), [CPU] * 4)


@pytest.mark.parametrize(
    'devices,error,match',
    [
        ([], ValueError, 'empty'),
        ('cpu', TypeError, 'list of devices'),
        (['not-a-device'], TypeError, r"devices\[0\] must be a device such as 'cpu'"),
    ],
)
def test_scatter_bad_devices(devices, error, match):
    with pytest.raises(error, match=match):
        d2lpar.scatter(torch.ones(4, 1), devices)


def test_scatter_bad_data():
    with pytest.raises(TypeError, match='must be a tensor'):
        d2lpar.scatter([1, 2, 3], [CPU])
    with pytest.raises(ValueError, match='0-dim'):
        d2lpar.scatter(torch.tensor(1.0), [CPU])


def test_split_batch_keeps_pairs_together():
    X, y = torch.arange(10).reshape(5, 2), torch.arange(5)
    X_shards, y_shards = d2lpar.split_batch(X, y, [CPU, CPU])
    assert [len(s) for s in X_shards] == [len(s) for s in y_shards] == [3, 2]
    for Xs, ys in zip(X_shards, y_shards):
        torch.testing.assert_close(Xs[:, 0] // 2, ys, rtol=0, atol=0)
    with pytest.raises(ValueError, match='same number of rows'):
        d2lpar.split_batch(X, y[:4], [CPU, CPU])
    with pytest.raises(TypeError, match='must be tensors'):
        d2lpar.split_batch(X, [0, 1, 2, 3, 4], [CPU, CPU])


@pytest.mark.parametrize('k', [1, 2, 3])
@pytest.mark.parametrize('dtype', [torch.float32, torch.int64])
def test_allreduce_matches_stacked_sum(k, dtype):
    torch.manual_seed(k)
    data = [(torch.randn(4, 3) * 10).to(dtype) for _ in range(k)]
    expected = torch.stack(data).sum(0)
    d2lpar.allreduce(data)
    for t in data:
        torch.testing.assert_close(t, expected)


def test_allreduce_same_device_entries_are_not_double_counted():
    # Two replicas on one device: the seed's version updates data[0] in place
    # and then reads it back, which is right only by accident of ordering.
    data = [torch.ones(2) * (i + 1) for i in range(3)]
    d2lpar.allreduce(data)
    for t in data:
        torch.testing.assert_close(t, torch.full((2,), 6.0))


def test_allreduce_refuses_aliases_and_mismatches():
    t = torch.ones(3)
    with pytest.raises(ValueError, match='share memory'):
        d2lpar.allreduce([t, t])
    base = torch.ones(6)
    with pytest.raises(ValueError, match='share memory'):
        d2lpar.allreduce([base[:3], base[3:]])
    with pytest.raises(ValueError, match='shape'):
        d2lpar.allreduce([torch.ones(3), torch.ones(4)])
    with pytest.raises(ValueError, match='dtype'):
        d2lpar.allreduce([torch.ones(3), torch.ones(3, dtype=torch.float64)])
    with pytest.raises(ValueError, match='empty'):
        d2lpar.allreduce([])
    with pytest.raises(TypeError, match='backward has not run'):
        d2lpar.allreduce([torch.ones(3), None])
    with pytest.raises(TypeError, match='list of tensors'):
        d2lpar.allreduce(torch.ones(3))


def test_allreduce_of_gradients_across_replicas():
    params = [torch.randn(3, 2)]
    replicas = [d2lpar.get_params(params, CPU) for _ in range(2)]
    X = torch.randn(4, 3)
    for replica, Xs in zip(replicas, d2lpar.scatter(X, [CPU, CPU])):
        (Xs @ replica[0]).sum().backward()
    d2lpar.allreduce([r[0].grad for r in replicas])
    reference = d2lpar.get_params(params, CPU)
    (X @ reference[0]).sum().backward()
    for replica in replicas:
        torch.testing.assert_close(replica[0].grad, reference[0].grad)


def missing_gpu():
    """Return a CUDA device that does not exist on this machine (cuda:0 without GPUs)."""
    return torch.device(f'cuda:{d2lpar.num_gpus()}')


def test_a_gpu_that_does_not_exist_is_named_with_what_exists():
    gpu = missing_gpu()
    count = d2lpar.num_gpus()
    have = 'no GPU' if count == 0 else f'{count} GPU(s)'
    params = [torch.ones(2)]
    with pytest.raises(
        ValueError,
        match=rf'get_params: device {gpu} does not exist: this '
        rf'machine has {have}.*d2lpar.num_gpus\(\).*nvidia-smi',
    ):
        d2lpar.get_params(params, gpu)
    with pytest.raises(
        ValueError,
        match=rf'scatter: devices\[1\] {gpu} does not exist: '
        rf'this machine has {have}',
    ):
        d2lpar.scatter(torch.ones(4, 1), [CPU, gpu])
    with pytest.raises(ValueError, match=rf'scatter: devices\[0\] {gpu} does not exist'):
        d2lpar.split_batch(torch.ones(4, 1), torch.ones(4), [str(gpu)])
    with pytest.raises(TypeError, match="get_params: device must be a device such as 'cpu'"):
        d2lpar.get_params(params, 'gpu0')


def test_the_saved_allreduce_adds_in_order_like_a_stacked_sum_across_dtypes():
    # The notebook's allreduce adds data[1], data[2], ... into data[0] in turn: for floats
    # that is the left-to-right sum, bit for bit.
    data = [torch.randn(100) for _ in range(4)]
    expected = ((data[0] + data[1]) + data[2]) + data[3]
    d2lpar.allreduce(data)
    for t in data:
        torch.testing.assert_close(t, expected, rtol=0, atol=0)
    grads = (torch.ones(2), torch.ones(2))  # a tuple works too: nothing is reassigned
    d2lpar.allreduce(grads)
    torch.testing.assert_close(grads[1], torch.full((2,), 2.0), rtol=0, atol=0)
