"""Data-parallel training from scratch, checked against plain single-device PyTorch SGD."""

import pytest
import torch
from torch.nn import functional as F

import d2lpar
from d2lpar.checks.nb08_lenet_data_parallel import _check_splits

CPU = torch.device('cpu')


def reference_sgd(params, batches, lr):
    """Train with plain autograd and torch.optim.SGD on the mean loss, on one device."""
    params = [p.detach().clone().requires_grad_() for p in params]
    optimizer = torch.optim.SGD(params, lr=lr)
    for X, y in batches:
        optimizer.zero_grad()
        F.cross_entropy(d2lpar.lenet(X, params), y).backward()
        optimizer.step()
    return [p.detach() for p in params]


def random_batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def assert_replicas_identical(device_params):
    for replica in device_params[1:]:
        for p, q in zip(device_params[0], replica):
            # .cpu(): with two GPUs the replicas live on different devices.
            torch.testing.assert_close(q.cpu(), p.cpu(), rtol=0, atol=0)
            assert (q.device, q.data_ptr()) != (p.device, p.data_ptr())


@pytest.mark.parametrize('k,n', [(1, 64), (2, 64), (1, 37), (2, 37), (3, 37)])
def test_train_batch_one_step_equals_single_device_sgd(k, n):
    params = d2lpar.init_lenet_params(seed=1)
    X, y = random_batch(n, seed=0)
    devices = [CPU] * k
    device_params = [d2lpar.get_params(params, d) for d in devices]
    d2lpar.train_batch(X, y, device_params, devices, lr=0.2)
    assert_replicas_identical(device_params)
    expected = reference_sgd(params, [(X, y)], lr=0.2)
    for p, q, p0 in zip(device_params[0], expected, params):
        assert not torch.equal(q, p0)  # every tensor moved: the comparison is not vacuous
        # float32 sums the slots' gradients in another order: last-digit differences only.
        torch.testing.assert_close(p.detach(), q, rtol=1e-5, atol=1e-6)
    # d2l's sgd zeroes each gradient after the update, ready for the next backward.
    assert all(not p.grad.any() for replica in device_params for p in replica)


@pytest.mark.parametrize('k,n', [(2, 64), (3, 37)])
def test_train_batch_many_steps_equal_single_device_sgd_in_float64(k, n):
    # Over several float32 steps a ReLU on the edge can amplify the last-digit
    # differences; float64 shows that the arithmetic itself is the same.
    params = [p.double() for p in d2lpar.init_lenet_params(seed=1)]
    batches = [(X.double(), y) for X, y in (random_batch(n, seed) for seed in range(4))]
    devices = [CPU] * k
    device_params = [d2lpar.get_params(params, d) for d in devices]
    for X, y in batches:
        d2lpar.train_batch(X, y, device_params, devices, lr=0.2)
    assert_replicas_identical(device_params)
    for p, q in zip(device_params[0], reference_sgd(params, batches, lr=0.2)):
        torch.testing.assert_close(p.detach(), q, rtol=1e-12, atol=1e-12)


def test_train_batch_per_slot_mean_would_be_wrong_for_uneven_splits():
    # Averaging per-slot mean losses weighs the 19 and 18 examples of each
    # slot alike: not the mean over the batch. Summing, then dividing by the
    # global batch size, is.
    params = d2lpar.init_lenet_params(seed=2)
    X, y = random_batch(37, seed=0)
    parts = zip(torch.chunk(X, 2), torch.chunk(y, 2))
    mean_of_means = sum(F.cross_entropy(d2lpar.lenet(Xs, params), ys) for Xs, ys in parts) / 2
    batch_mean = F.cross_entropy(d2lpar.lenet(X, params), y)
    assert abs(float(mean_of_means - batch_mean)) > 1e-4


def test_train_batch_bad_input():
    params = d2lpar.init_lenet_params(seed=0)
    X, y = random_batch(8, seed=0)
    devices = [CPU, CPU]
    with pytest.raises(ValueError, match='1 replicas for 2 devices'):
        d2lpar.train_batch(X, y, [d2lpar.get_params(params, CPU)], devices, 0.1)
    with pytest.raises(TypeError, match='one list of parameter tensors per device'):
        d2lpar.train_batch(X, y, d2lpar.get_params(params, CPU), devices, 0.1)
    replica = d2lpar.get_params(params, CPU)
    with pytest.raises(ValueError, match='share memory'):
        d2lpar.train_batch(X, y, [replica, replica], devices, 0.1)


@pytest.mark.parametrize('lr', [None, '0.1', -1.0, float('nan')])
def test_train_batch_bad_lr_is_refused_before_any_gradient(lr):
    params = d2lpar.init_lenet_params(seed=0)
    X, y = random_batch(8, seed=0)
    replicas = [d2lpar.get_params(params, CPU) for _ in range(2)]
    with pytest.raises(ValueError, match='train_batch: lr must be a positive number'):
        d2lpar.train_batch(X, y, replicas, [CPU, CPU], lr)
    assert all(p.grad is None for replica in replicas for p in replica)


def test_a_failed_step_leaves_no_gradient_for_the_next(monkeypatch):
    params = d2lpar.init_lenet_params(seed=0)
    X, y = random_batch(8, seed=0)
    replicas = [d2lpar.get_params(params, CPU) for _ in range(2)]

    def fails_on_the_second_slot(X, params):
        if params is replicas[1]:  # the second slot's forward fails, after the first slot's
            raise RuntimeError('out of memory (simulated)')
        return d2lpar.lenet(X, params)

    # Every forward runs before any backward, so a failed forward leaves no gradient
    # behind that the next step would add to its own.
    monkeypatch.setattr(d2lpar.lessons.nb08_lenet_data_parallel, 'lenet', fails_on_the_second_slot)
    with pytest.raises(RuntimeError, match='simulated'):
        d2lpar.train_batch(X, y, replicas, [CPU, CPU], 0.1)
    monkeypatch.undo()
    assert all(p.grad is None for replica in replicas for p in replica)
    d2lpar.train_batch(X, y, replicas, [CPU, CPU], 0.1)  # the next step is a clean step
    for p, q in zip(replicas[0], reference_sgd(params, [(X, y)], 0.1)):
        torch.testing.assert_close(p.detach(), q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('label', [10, -1])
def test_train_batch_refuses_a_label_outside_0_to_9_before_any_gradient(label):
    params = d2lpar.init_lenet_params(seed=0)
    X, y = random_batch(8, seed=0)
    y[3] = label
    replicas = [d2lpar.get_params(params, CPU) for _ in range(2)]
    with pytest.raises(
        ValueError,
        match=rf'train_batch: y holds the label {label}, but LeNet '
        r'has 10 outputs, for the classes 0\.\.9',
    ):
        d2lpar.train_batch(X, y, replicas, [CPU, CPU], 0.1)
    assert all(p.grad is None for replica in replicas for p in replica)
    with pytest.raises(TypeError, match='integer class labels'):
        d2lpar.train_batch(X, y.float(), replicas, [CPU, CPU], 0.1)


def test_sgd_matches_torch_optim_sgd():
    """d2l's sgd(params, lr, batch_size) on summed-loss gradients is SGD on the mean loss."""
    params = d2lpar.init_lenet_params(seed=3)
    X, y = random_batch(16, seed=1)
    mine = d2lpar.get_params(params, CPU)
    before = [p.data_ptr() for p in mine]
    F.cross_entropy(d2lpar.lenet(X, mine), y, reduction='sum').backward()
    d2lpar.sgd(mine, 0.3, 16)
    expected = reference_sgd(params, [(X, y)], lr=0.3)
    for p, q, p0 in zip(mine, expected, params):
        assert not torch.equal(q, p0)
        torch.testing.assert_close(p.detach(), q, rtol=1e-5, atol=1e-7)
    assert [p.data_ptr() for p in mine] == before  # in place
    assert all(p.grad is not None and not p.grad.any() for p in mine)  # zeroed, not dropped
    # The same gradient in both: sgd(lr, n) is torch.optim.SGD(lr / n), exactly.
    a = [torch.randn(5, requires_grad=True)]
    b = [a[0].detach().clone().requires_grad_()]
    a[0].grad, b[0].grad = torch.full((5,), 2.0), torch.full((5,), 2.0)
    d2lpar.sgd(a, 0.5, 4)
    torch.optim.SGD(b, lr=0.5 / 4).step()
    torch.testing.assert_close(a[0].detach(), b[0].detach(), rtol=0, atol=0)


def test_sgd_bad_input():
    p = torch.ones(3, requires_grad=True)
    with pytest.raises(ValueError, match=r'sgd: params\[0\] has no gradient'):
        d2lpar.sgd([p], 0.1, 4)
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match='sgd: lr must be a positive number'):
        d2lpar.sgd([p], float('nan'), 4)
    with pytest.raises(ValueError, match='sgd: batch_size must be a positive int'):
        d2lpar.sgd([p], 0.1, 0)


def test_check_splits():
    _check_splits(10, 4, 2, None)  # 4 + 4 + 2: every batch feeds both slots
    with pytest.raises(ValueError, match='minibatch of 2 examples cannot be split across 3'):
        _check_splits(10, 4, 3, None)
    with pytest.raises(ValueError, match='minibatch of 4 examples cannot be split across 3'):
        _check_splits(10, 6, 3, None)  # 6 splits, the last batch of 4 does not
    _check_splits(10, 6, 3, 1)  # the last batch is never reached


def test_train_learns_and_keeps_replicas_identical():
    torch.manual_seed(0)
    result = d2lpar.train(2, 256, 0.2, num_epochs=2, max_batches=20, params=d2lpar.init_lenet_params(seed=0))
    assert result.test_acc > 0.4  # chance is 0.1
    assert len(result.devices) == 2 and result.sec_per_epoch > 0
    assert_replicas_identical(result.device_params)


@pytest.mark.parametrize(
    'kwargs,match',
    [
        (dict(num_gpus=0), 'num_gpus must be a positive int'),
        (dict(lr=-0.1), 'lr must be a positive number'),
        (dict(num_epochs=0), 'num_epochs must be a positive int'),
        (dict(max_batches=0), r'max_batches must be a positive int, got 0 \(or None'),
        (dict(num_gpus=3, batch_size=4), 'cannot be split across 3 device slots'),
        (dict(batch_size=0), 'batch_size must be a positive int'),
        (dict(batch_size=8.0), 'batch_size must be a positive int'),
        (dict(params=d2lpar.init_lenet_params()[:6]), "params must be LeNet's 8 tensors"),
    ],
)
def test_train_bad_arguments(kwargs, match):
    args = dict(dict(num_gpus=1, batch_size=256, lr=0.2), **kwargs)
    with pytest.raises(ValueError, match=match):
        d2lpar.train(**args)
