"""What every training script of notebook 5 shares: one data set, one model, one set of flags.

Not run by itself: `train_single.py`, `ddp_spawn.py`, `ddp_torchrun.py` and
`ddp_multinode.py` import it (Python finds it because it sits next to them).
"""
import argparse
import os

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset

from d2lpar.distributed import BACKENDS, default_timeout


def get_args(description):
    """Parse the flags every script accepts (each script uses the ones that apply to it)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('--epochs', type=int, default=4)
    parser.add_argument('--batch-size', type=int, default=32,
                        help='global batch size: each of W processes takes batch_size / W')
    parser.add_argument('--lr', type=float, default=0.05)
    parser.add_argument('--num-samples', type=int, default=512)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--backend', choices=BACKENDS, default=None,
                        help='default: nccl when every process has a GPU of its own, else gloo')
    parser.add_argument('--timeout', type=float, default=default_timeout().total_seconds(),
                        help='seconds init_process_group (and each collective) may wait')
    parser.add_argument('--nproc', type=int, default=2, help='processes mp.spawn starts')
    parser.add_argument('--init-method', default='env://',
                        help='env://, tcp://HOST:PORT or file:///path (mp.spawn script)')
    parser.add_argument('--ckpt', default=None, help='checkpoint file, rewritten every epoch')
    parser.add_argument('--resume', action='store_true', help='continue from --ckpt')
    args = parser.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or args.num_samples < args.batch_size:
        parser.error('need epochs >= 1 and 1 <= batch-size <= num-samples')
    if args.resume and not args.ckpt:
        parser.error('--resume needs --ckpt')
    return args


def local_batch_size(batch_size, world_size):
    """Return each process's share of the global batch, which must divide evenly."""
    if batch_size % world_size:
        raise SystemExit(f'--batch-size {batch_size} does not split evenly over {world_size} '
                         f'processes; choose a multiple of {world_size}')
    return batch_size // world_size


def make_dataset(num_samples, seed=0):
    """Return a synthetic 4-class data set: noisy points around 4 centres in 16-d."""
    g = torch.Generator().manual_seed(1000 + seed)  # the same data in every process
    centres = torch.randn(4, 16, generator=g) * 0.5
    y = torch.randint(0, 4, (num_samples,), generator=g)
    X = centres[y] + torch.randn(num_samples, 16, generator=g)
    return TensorDataset(X, y)


def make_net():
    """Return the model: a small MLP (no BatchNorm, so no buffers to synchronise)."""
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def make_loader(dataset, batch_size, num_replicas, rank, seed):
    """Return (sampler, loader): this rank's shard, shuffled per epoch, in full batches."""
    # With num_replicas=1 this is a plain shuffle; with W replicas, rank r gets
    # positions r, r+W, r+2W, ... of the same permutation, so the W local batches
    # of one step together are exactly the global batch of a single process.
    sampler = DistributedSampler(dataset, num_replicas=num_replicas, rank=rank,
                                 shuffle=True, seed=seed)
    batches = BatchSampler(sampler, batch_size, drop_last=True)
    return sampler, DataLoader(dataset, batch_sampler=batches)


def train_epoch(net, train_iter, optimizer, device):
    """Train one epoch; return the sum of the batch losses and the number of batches."""
    loss_fn = nn.CrossEntropyLoss()
    total, n = torch.zeros((), device=device), 0
    for X, y in train_iter:
        X, y = X.to(device), y.to(device)
        optimizer.zero_grad()
        loss = loss_fn(net(X), y)
        loss.backward()  # under DDP, gradients are averaged across ranks here
        optimizer.step()
        total += loss.detach()
        n += 1
    return total, n


def flat_params(net):
    """Return all parameters as one flat tensor (on the parameters' device)."""
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def save_checkpoint(path, net, optimizer, epoch):
    """Write a checkpoint atomically: a reader sees the old file or the new one, never half."""
    state = {'net': net.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch}
    tmp = f'{path}.tmp{os.getpid()}'
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic on POSIX and Windows when on the same file system


def load_checkpoint(path, net, optimizer, map_location):
    """Load a checkpoint onto `map_location`; return the epoch to continue from."""
    state = torch.load(path, map_location=map_location, weights_only=True)
    net.load_state_dict(state['net'])
    optimizer.load_state_dict(state['optimizer'])
    return state['epoch'] + 1
