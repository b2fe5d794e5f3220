"""Models: the functional LeNet of the from-scratch notebook, and evaluation."""
import torch
from torch import nn
from torch.nn import functional as F

from .timing import Accumulator

__all__ = ['init_lenet_params', 'lenet', 'accuracy', 'evaluate_accuracy_gpu']

LENET_SHAPES = ((20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,),
                (800, 128), (128,), (128, 10), (10,))


def init_lenet_params(scale=0.1, seed=None):
    """Return LeNet's parameters as plain tensors: weights ~ N(0, scale^2), biases 0."""
    # d2l draws with scale 0.01, which leaves the signal so small that plain SGD
    # sits at chance for most of the first epoch; 0.1 starts learning at once.
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    return [torch.randn(shape, generator=g) * scale if len(shape) > 1 else torch.zeros(shape)
            for shape in LENET_SHAPES]


def lenet(X, params):
    """Run LeNet on a batch `X` of shape (n, 1, 28, 28) with raw parameter tensors."""
    if len(params) != len(LENET_SHAPES):
        raise ValueError(f'lenet expects {len(LENET_SHAPES)} parameter tensors '
                         f'(see init_lenet_params), got {len(params)}')
    h1 = F.avg_pool2d(F.relu(F.conv2d(X, params[0], params[1])), kernel_size=2, stride=2)
    h2 = F.avg_pool2d(F.relu(F.conv2d(h1, params[2], params[3])), kernel_size=2, stride=2)
    h2 = h2.reshape(h2.shape[0], -1)
    h3 = F.relu(h2 @ params[4] + params[5])
    return h3 @ params[6] + params[7]


def accuracy(y_hat, y):
    """Compute the number of correct predictions."""
    if y_hat.dim() > 1 and y_hat.shape[1] > 1:  # scores per class: take the best class
        y_hat = y_hat.argmax(dim=1)
    return float((y_hat.type(y.dtype) == y).sum())


def evaluate_accuracy_gpu(net, data_iter, device=None):
    """Compute the accuracy for a model on a dataset using a GPU (or any device)."""
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
