"""The functional LeNet against the same network built from torch.nn layers."""
import pytest
import torch
from torch import nn

import d2lpar


def reference_lenet(params):
    net = nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2, 2),
                        nn.Conv2d(20, 50, 5), nn.ReLU(), nn.AvgPool2d(2, 2), nn.Flatten(),
                        nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
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
