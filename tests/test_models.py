"""The functional LeNet against the same network built from torch.nn layers."""

import pytest
import torch
from torch import nn

import d2lpar


def reference_lenet(params):
    net = nn.Sequential(
        nn.Conv2d(1, 20, 3),
        nn.ReLU(),
        nn.AvgPool2d(2, 2),
        nn.Conv2d(20, 50, 5),
        nn.ReLU(),
        nn.AvgPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(800, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )
    with torch.no_grad():
        for layer, (W, b) in zip([net[0], net[3], net[7], net[9]], zip(params[::2], params[1::2])):
            layer.weight.copy_(W.T if W.dim() == 2 else W)
            layer.bias.copy_(b)
    return net


def test_lenet_matches_torch_nn():
    params = d2lpar.init_lenet_params(seed=1)
    for p in params[1::2]:
        p.normal_()  # non-zero biases, so they are checked too
    X = torch.randn(5, 1, 28, 28)
    torch.testing.assert_close(d2lpar.lenet(X, params), reference_lenet(params)(X))


def test_init_is_seeded_and_scaled():
    a, b = d2lpar.init_lenet_params(seed=3), d2lpar.init_lenet_params(seed=3)
    for p, q in zip(a, b):
        assert torch.equal(p, q)
    big = d2lpar.init_lenet_params(scale=1.0, seed=0)[4]
    assert 0.9 < float(big.std()) < 1.1
    assert float(d2lpar.init_lenet_params(seed=0)[4].std()) == pytest.approx(0.1, rel=0.1)
    assert all(float(b.abs().sum()) == 0 for b in a[1::2])


def test_lenet_wrong_params():
    with pytest.raises(ValueError, match='expects 8 parameter tensors'):
        d2lpar.lenet(torch.randn(1, 1, 28, 28), d2lpar.init_lenet_params()[:6])


def test_evaluate_accuracy_by_hand():
    X = torch.eye(4)
    y = torch.tensor([0, 1, 0, 0])  # identity logits predict 0,1,2,3: two right
    loader = d2lpar.TensorLoader(X, y, 3)
    assert d2lpar.evaluate_accuracy_gpu(lambda X: X, loader) == 0.5
    net = nn.Linear(4, 4)
    with torch.no_grad():
        net.weight.copy_(torch.eye(4))
        net.bias.zero_()
    net.train()
    assert d2lpar.evaluate_accuracy_gpu(net, loader) == 0.5
    assert not net.training
    with pytest.raises(ValueError, match='no examples'):
        d2lpar.evaluate_accuracy_gpu(net, [])


def test_accuracy_of_scores_and_of_class_indices():
    y = torch.tensor([0, 2, 1])
    scores = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
    assert d2lpar.accuracy(scores, y) == 2.0  # by hand: rows 0 and 1 are right
    assert d2lpar.accuracy(torch.tensor([0, 2, 0]), y) == 2.0  # predicted classes, as d2l allows


def test_init_shapes_are_the_ones_the_checks_expect():
    from d2lpar.models import LENET_SHAPES

    assert tuple(tuple(p.shape) for p in d2lpar.init_lenet_params()) == LENET_SHAPES


def test_lenet_says_what_input_it_expects():
    params = d2lpar.init_lenet_params(seed=0)
    with pytest.raises(
        ValueError,
        match=r'lenet expects X of shape N x 1 x 28 x 28 .*got '
        r'\(2, 1, 32, 32\); load Fashion-MNIST at its own size',
    ):
        d2lpar.lenet(torch.randn(2, 1, 32, 32), params)
    with pytest.raises(ValueError, match=r'got \(2, 28, 28\); add the channel dimension'):
        d2lpar.lenet(torch.randn(2, 28, 28), params)
    with pytest.raises(
        ValueError,
        match=r'lenet: X is torch.float64 on cpu but the parameters '
        r'are torch.float32 on cpu',
    ):
        d2lpar.lenet(torch.randn(2, 1, 28, 28, dtype=torch.float64), params)
    with pytest.raises(
        ValueError,
        match=r'lenet: params\[2\] must be a tensor of shape '
        r'\(50, 20, 5, 5\), got \(50, 20, 3, 3\)',
    ):
        d2lpar.lenet(torch.randn(2, 1, 28, 28), params[:2] + [torch.randn(50, 20, 3, 3)] + params[3:])
    with pytest.raises(TypeError, match='lenet: X must be a tensor'):
        d2lpar.lenet([[0.0]], params)


def test_init_bad_arguments():
    with pytest.raises(ValueError, match='scale must be a positive number'):
        d2lpar.init_lenet_params(scale=float('nan'))
    with pytest.raises(TypeError, match='seed must be an int or None'):
        d2lpar.init_lenet_params(seed='0')


def test_evaluate_on_a_gpu_that_does_not_exist():
    gpu = torch.device(f'cuda:{d2lpar.num_gpus()}')
    loader = d2lpar.TensorLoader(torch.eye(4), torch.arange(4), 2)
    with pytest.raises(
        ValueError,
        match=rf'evaluate_accuracy_gpu: device {gpu} does not exist.*'
        r'nvidia-smi',
    ):
        d2lpar.evaluate_accuracy_gpu(lambda X: X, loader, gpu)
    with pytest.raises(TypeError, match='net must be a model or a function'):
        d2lpar.evaluate_accuracy_gpu(None, loader)
