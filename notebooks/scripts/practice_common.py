"""What the parts of ddp_practice.py share: one small MLP, one data set, parameters flattened.

Not run by itself: ddp_practice.py imports it (Python finds it because it sits next to it).
"""
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class MLP(nn.Module):
    """A small MLP: Linear layers of the given widths with ReLU between them."""

    def __init__(self, widths):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, X):
        for layer in self.layers[:-1]:
            X = torch.relu(layer(X))
        return self.layers[-1](X)


def make_net(widths=(16, 64, 64, 4), seed=0):
    torch.manual_seed(seed)  # the same start on every rank and in every reference
    return MLP(widths)


def make_data(n, seed=1, dim=16):
    """Return n samples of 4 noisy classes in `dim` dimensions, the same in every process."""
    centres = torch.randn(4, dim, generator=torch.Generator().manual_seed(0))  # every set's
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    return centres[y] + 0.8 * torch.randn(n, dim, generator=g), y


def flat(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).cpu()


def flat_grad(net):
    return torch.cat([p.grad.reshape(-1) for p in net.parameters()]).cpu()


def max_diff(a, b):
    return (a - b).abs().max().item()


def ddp(net, device, **kwargs):
    ids = [device.index] if device.type == 'cuda' else None
    return DDP(net.to(device), device_ids=ids, **kwargs)
