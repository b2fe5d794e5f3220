"""A reader of d2l's two multi-GPU chapters can swap in `import d2lpar as d2l`.

The training loops below are written the way those chapters write them, against
d2l's names only, and run on CPU slots; each is checked against a plain
one-device reference.
"""

import inspect
import itertools

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import d2lpar as d2l

# What the chapters "Multi-GPU Training" (from scratch) and "Concise Implementation for
# Multiple GPUs" call on d2l, with d2l's leading parameters.
SIGNATURES = {
    'load_data_fashion_mnist': ['batch_size', 'resize'],
    'try_gpu': ['i'],
    'try_all_gpus': [],
    'sgd': ['params', 'lr', 'batch_size'],
    'Animator': ['xlabel', 'ylabel', 'legend', 'xlim', 'ylim'],
    'Timer': [],
    'evaluate_accuracy_gpu': ['net', 'data_iter', 'device'],
    'Residual': ['num_channels', 'use_1x1conv', 'strides'],
    'Accumulator': ['n'],
    'accuracy': ['y_hat', 'y'],
    'get_params': ['params', 'device'],
    'allreduce': ['data'],
    'split_batch': ['X', 'y', 'devices'],
    'lenet': ['X', 'params'],
}


@pytest.mark.parametrize('name', sorted(SIGNATURES))
def test_d2l_names_exist_with_d2l_signatures(name):
    obj = getattr(d2l, name)
    names = list(inspect.signature(obj).parameters)
    assert names[: len(SIGNATURES[name])] == SIGNATURES[name], names


def test_sgd_is_plain_minibatch_sgd():
    torch.manual_seed(0)
    w = torch.randn(3, requires_grad=True)
    reference = w.detach().clone().requires_grad_()
    (w * torch.arange(3.0)).sum().backward()
    (reference * torch.arange(3.0)).sum().backward()
    optimizer = torch.optim.SGD([reference], lr=0.5 / 4)  # d2l's sgd divides by the batch size
    optimizer.step()
    d2l.sgd([w], 0.5, 4)
    torch.testing.assert_close(w, reference, rtol=0, atol=0)
    assert torch.equal(w.grad, torch.zeros(3))  # and leaves the gradient zeroed for the next step


def train_batch(X, y, device_params, devices, lr):
    """One data-parallel step, as the from-scratch chapter writes it."""
    loss = nn.CrossEntropyLoss(reduction='none')
    X_shards, y_shards = d2l.split_batch(X, y, devices)
    ls = [
        loss(d2l.lenet(X_shard, device_W), y_shard).sum()
        for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params)
    ]
    for l in ls:
        l.backward()
    with torch.no_grad():
        for i in range(len(device_params[0])):
            d2l.allreduce([device_params[c][i].grad for c in range(len(devices))])
    for param in device_params:
        d2l.sgd(param, lr, X.shape[0])


def test_the_from_scratch_chapter_runs_on_cpu_slots():
    batch_size, lr, num_gpus = 256, 0.2, 2
    train_iter, test_iter = d2l.load_data_fashion_mnist(batch_size)
    assert len(train_iter.dataset) == 60000  # d2l code asks the loader for its data set
    # float64, so that the two ways of adding up the gradients agree to rounding
    params = [p.double() for p in d2l.init_lenet_params(seed=0)]
    devices = d2l.device_slots(num_gpus, verbose=False)  # try_gpu(i) for i < num_gpus, on CPU
    device_params = [d2l.get_params(params, d) for d in devices]
    reference = d2l.get_params(params, torch.device('cpu'))
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, 2])
    timer = d2l.Timer()
    for X, y in itertools.islice(train_iter, 3):
        X = X.double()
        train_batch(X, y, device_params, devices, lr)
        # the same step on one device, on the whole batch
        F.cross_entropy(d2l.lenet(X, reference), y, reduction='sum').backward()
        d2l.sgd(reference, lr, X.shape[0])
    timer.stop()
    for replica in device_params:
        for p, q in zip(replica, reference):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-9, atol=1e-12)
    small_test = d2l.TensorLoader(test_iter.X[:512].double(), test_iter.y[:512], 256)
    acc = d2l.evaluate_accuracy_gpu(lambda x: d2l.lenet(x, device_params[0]), small_test, devices[0])
    animator.add(1, (acc,))
    assert 0 <= acc <= 1 and animator.Y[0][-1] == acc and animator.axes[0] is not None
    assert timer.avg() > 0


def resnet18(num_classes, in_channels=1):
    """A small ResNet, as the concise chapter builds it from d2l.Residual."""

    def resnet_block(out_channels, num_residuals, first_block=False):
        return nn.Sequential(
            *[
                d2l.Residual(out_channels, use_1x1conv=True, strides=2)
                if i == 0 and not first_block
                else d2l.Residual(out_channels)
                for i in range(num_residuals)
            ]
        )

    return nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        resnet_block(64, 2, first_block=True),
        resnet_block(128, 2),
        nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten(),
        nn.Linear(128, num_classes),
    )


def test_the_concise_chapter_runs_with_dataparallel():
    torch.manual_seed(0)
    train_iter, test_iter = d2l.load_data_fashion_mnist(64)
    devices = d2l.try_all_gpus()
    net = resnet18(10)
    net(torch.zeros(2, 1, 28, 28))  # lazy layers take their shapes from a first batch
    net = nn.DataParallel(net, device_ids=devices)
    trainer = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = nn.CrossEntropyLoss()
    losses = []
    for X, y in itertools.islice(train_iter, 2):
        trainer.zero_grad()
        l = loss(net(X.to(devices[0])), y.to(devices[0]))
        l.backward()
        trainer.step()
        losses.append(l.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    small_test = d2l.TensorLoader(test_iter.X[:128], test_iter.y[:128], 64)
    acc = d2l.evaluate_accuracy_gpu(net, small_test)
    assert 0 <= acc <= 1


def test_residual_is_two_convolutions_and_a_shortcut():
    torch.manual_seed(0)
    block = d2l.Residual(6, use_1x1conv=True, strides=2).eval()
    X = torch.randn(2, 3, 8, 8)
    Y = block(X)
    assert Y.shape == (2, 6, 4, 4)
    by_hand = F.relu(block.bn2(block.conv2(F.relu(block.bn1(block.conv1(X))))) + block.conv3(X))
    torch.testing.assert_close(Y, by_hand)
    same = d2l.Residual(3).eval()
    assert same(X).shape == X.shape and same.conv3 is None


@pytest.mark.parametrize(
    'args, error, message',
    [
        ((0,), ValueError, 'num_channels must be a positive int'),
        ((3, 6), TypeError, 'use_1x1conv must be True or False.*older d2l'),
        ((3, False, 0), ValueError, 'strides must be a positive int'),
    ],
)
def test_residual_refuses_bad_arguments(args, error, message):
    with pytest.raises(error, match=message):
        d2l.Residual(*args)
