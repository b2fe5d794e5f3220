"""d2l's own helpers, with the book's names and signatures: accuracy, evaluate_accuracy_gpu, sgd, Residual.

d2l defines them in chapters before this course; notebook 8 and the benchmarks use them.
"""

import torch
from torch import nn
from torch.nn import functional as F

from ..checks import checked
from ..checks.nb08_lenet_data_parallel import _check_evaluate_accuracy_gpu, _check_residual, _check_sgd
from ..timing import Accumulator

__all__ = ['accuracy', 'evaluate_accuracy_gpu', 'sgd', 'Residual']


def accuracy(y_hat, y):
    """Return how many rows of `y_hat` pick the label in `y` (class scores or labels)."""
    if y_hat.dim() > 1 and y_hat.shape[1] > 1:  # scores per class: take the best class
        y_hat = y_hat.argmax(dim=1)
    return float((y_hat.type(y.dtype) == y).sum())


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


@checked(_check_sgd)
def sgd(params, lr, batch_size):
    """Move each parameter against its gradient over the batch, then clear the gradient.

    The gradients hold sums over `batch_size` examples: dividing by it makes each
    step follow the mean loss, whatever the batch size.
    """
    with torch.no_grad():
        for p in params:
            step = lr * p.grad / batch_size
            p.sub_(step)
            p.grad.zero_()  # the next backward adds into a clean gradient


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
        self.conv3 = nn.LazyConv2d(num_channels, kernel_size=1, stride=strides) if use_1x1conv else None
        self.bn1, self.bn2 = nn.LazyBatchNorm2d(), nn.LazyBatchNorm2d()

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        shortcut = X if self.conv3 is None else self.conv3(X)
        return F.relu(Y + shortcut)
