"""Models: the functional LeNet of notebook 8 (its `#@save` cells), and evaluation."""
import math

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import checked, existing_device
from .timing import Accumulator

__all__ = ['init_lenet_params', 'lenet', 'accuracy', 'evaluate_accuracy_gpu']

# What init_lenet_params returns, for the checks (tests/test_models.py compares the two).
LENET_SHAPES = ((20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,),
                (800, 128), (128,), (128, 10), (10,))


def _check_init_lenet_params(scale=0.1, seed=None):
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) \
            or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f'init_lenet_params: scale must be a positive number, got {scale!r}')
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise TypeError(f'init_lenet_params: seed must be an int or None, got {seed!r}')
    if seed is not None and not -2 ** 63 <= seed < 2 ** 64:  # what torch.manual_seed takes
        raise ValueError(f'init_lenet_params: seed must be in [-2**63, 2**64), got {seed!r}')


@checked(_check_init_lenet_params)
def init_lenet_params(scale=0.1, seed=None):
    """Return LeNet's eight parameters: weights drawn from N(0, scale²), biases zero."""
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    W1 = torch.randn(20, 1, 3, 3, generator=g) * scale
    b1 = torch.zeros(20)
    W2 = torch.randn(50, 20, 5, 5, generator=g) * scale
    b2 = torch.zeros(50)
    W3 = torch.randn(800, 128, generator=g) * scale
    b3 = torch.zeros(128)
    W4 = torch.randn(128, 10, generator=g) * scale
    b4 = torch.zeros(10)
    return [W1, b1, W2, b2, W3, b3, W4, b4]


def _check_lenet(X, params):
    if isinstance(params, torch.Tensor) or not hasattr(params, '__len__') \
            or len(params) != len(LENET_SHAPES):
        got = len(params) if hasattr(params, '__len__') and not isinstance(params, torch.Tensor) \
            else type(params).__name__
        raise ValueError(f'lenet expects {len(LENET_SHAPES)} parameter tensors '
                         f'(see init_lenet_params), got {got}')
    for i, (p, shape) in enumerate(zip(params, LENET_SHAPES)):
        if not isinstance(p, torch.Tensor) or tuple(p.shape) != shape:
            got = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(f'lenet: params[{i}] must be a tensor of shape {shape}, got {got}; '
                             'make the parameters with init_lenet_params')
    if not isinstance(X, torch.Tensor):
        raise TypeError(f'lenet: X must be a tensor, got {type(X).__name__}')
    if X.dim() != 4 or tuple(X.shape[1:]) != (1, 28, 28):
        if X.dim() == 3 and tuple(X.shape[1:]) == (28, 28):
            hint = 'add the channel dimension with X.unsqueeze(1)'
        elif X.dim() == 4 and X.shape[1] == 1:
            hint = ('load Fashion-MNIST at its own size, without resize '
                    '(d2lpar.load_data_fashion_mnist(batch_size))')
        else:
            hint = 'reshape the batch to one-channel 28x28 images'
        raise ValueError(f'lenet expects X of shape N x 1 x 28 x 28 (a batch of one-channel '
                         f'28x28 images), got {tuple(X.shape)}; {hint}')
    if X.device != params[0].device or X.dtype != params[0].dtype:
        raise ValueError(f'lenet: X is {X.dtype} on {X.device} but the parameters are '
                         f'{params[0].dtype} on {params[0].device}; move the batch with '
                         'X.to(params[0].device, params[0].dtype)')


@checked(_check_lenet)
def lenet(X, params):
    """Run LeNet on a batch `X` of shape (n, 1, 28, 28) with raw parameter tensors."""
    h1 = F.avg_pool2d(F.relu(F.conv2d(X, params[0], params[1])), kernel_size=2, stride=2)
    h2 = F.avg_pool2d(F.relu(F.conv2d(h1, params[2], params[3])), kernel_size=2, stride=2)
    h2 = h2.reshape(h2.shape[0], -1)
    h3 = F.relu(h2 @ params[4] + params[5])
    return h3 @ params[6] + params[7]


def accuracy(y_hat, y):
    """Return how many rows of `y_hat` pick the label in `y` (class scores or labels)."""
    if y_hat.dim() > 1 and y_hat.shape[1] > 1:  # scores per class: take the best class
        y_hat = y_hat.argmax(dim=1)
    return float((y_hat.type(y.dtype) == y).sum())


def _check_evaluate_accuracy_gpu(net, data_iter, device=None):
    if not callable(net):
        raise TypeError(f'evaluate_accuracy_gpu: net must be a model or a function of X, '
                        f'got {type(net).__name__}')
    if device is not None:
        return (net, data_iter, existing_device(device, 'evaluate_accuracy_gpu')), {}


@checked(_check_evaluate_accuracy_gpu)
def evaluate_accuracy_gpu(net, data_iter, device=None):
    """Return the share of examples in `data_iter` that `net` classifies right.

    Each batch is moved to `device` (by default, where the network's parameters
    are); a module is put in evaluation mode first.
    """
    if isinstance(net, nn.Module):
        net.eval()
        if device is None:
            device = next(iter(net.parameters()), torch.empty(0)).device
    device = torch.device(device) if device is not None else torch.device('cpu')
    metric = Accumulator(2)  # correct predictions, predictions
    with torch.no_grad():
        for X, y in data_iter:
            X, y = X.to(device), y.to(device)
            metric.add(accuracy(net(X), y), y.numel())
    if metric[1] == 0:
        raise ValueError('evaluate_accuracy_gpu: data_iter yielded no examples')
    return metric[0] / metric[1]


def _check_residual(num_channels, use_1x1conv=False, strides=1):
    if isinstance(num_channels, bool) or not isinstance(num_channels, int) or num_channels < 1:
        raise ValueError(f'Residual: num_channels must be a positive int, got {num_channels!r}')
    if not isinstance(use_1x1conv, bool):
        raise TypeError(f'Residual: use_1x1conv must be True or False, got {use_1x1conv!r}. '
                        'This is the signature of d2l 1.0, Residual(num_channels, '
                        'use_1x1conv=False, strides=1): older d2l took the input channels '
                        'first, which lazy layers now infer')
    if isinstance(strides, bool) or not isinstance(strides, int) or strides < 1:
        raise ValueError(f'Residual: strides must be a positive int, got {strides!r}')


class Residual(nn.Module):
    """The residual block of ResNet, as d2l's: two 3x3 convolutions and a shortcut.

    The layers are lazy: they take their input channels from the first batch.
    `use_1x1conv` puts a 1x1 convolution on the shortcut, needed when the block
    changes the number of channels or, with `strides` > 1, the resolution.
    """

    def __init__(self, num_channels, use_1x1conv=False, strides=1):
        _check_residual(num_channels, use_1x1conv, strides)
        super().__init__()
        self.conv1 = nn.LazyConv2d(num_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.LazyConv2d(num_channels, kernel_size=3, padding=1)
        self.conv3 = (nn.LazyConv2d(num_channels, kernel_size=1, stride=strides)
                      if use_1x1conv else None)
        self.bn1, self.bn2 = nn.LazyBatchNorm2d(), nn.LazyBatchNorm2d()

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        shortcut = X if self.conv3 is None else self.conv3(X)
        return F.relu(Y + shortcut)
