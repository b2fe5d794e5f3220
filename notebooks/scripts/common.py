"""What the training scripts of notebooks 5 and 6 share: one data set, one model, one set of flags.

Not run by itself: `train_single.py`, `ddp_spawn.py`, `ddp_torchrun.py`,
`ddp_multinode.py` and `ddp_restart.py` import it (Python finds it because it sits
next to them). The training itself (`make_loader`, `train_ddp`) is d2lpar.ddp's,
written in notebook 5's cells.
"""
import argparse
import datetime

import torch
from torch import nn
from torch.utils.data import TensorDataset

import d2lpar
from d2lpar.distributed import BACKENDS


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
    parser.add_argument('--timeout', type=float, default=None,
                        help='seconds init_process_group (and each collective) may wait: short '
                             "(60) while debugging; default torch's (30 min gloo, 10 min nccl)")
    parser.add_argument('--nproc', type=int, default=2, help='processes mp.spawn starts')
    parser.add_argument('--init-method', default='env://',
                        help='env://, tcp://HOST:PORT or file:///path (mp.spawn script)')
    parser.add_argument('--ckpt', default=None, help='checkpoint file, rewritten every epoch')
    parser.add_argument('--resume', action='store_true', help='continue from --ckpt')
    parser.add_argument('--snapshot', default='snapshot.pt',
                        help='ddp_restart.py: snapshot file, loaded at start if it exists')
    parser.add_argument('--fail-at-epoch', type=int, default=None,
                        help='ddp_restart.py: rank 0 dies at the end of this epoch, first attempt')
    args = parser.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or args.num_samples < args.batch_size:
        parser.error('need epochs >= 1 and 1 <= batch-size <= num-samples')
    if args.resume and not args.ckpt:
        parser.error('--resume needs --ckpt')
    if args.timeout is not None and args.timeout <= 0:
        parser.error('--timeout must be a positive number of seconds')
    args.timeout = None if args.timeout is None else datetime.timedelta(seconds=args.timeout)
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


def flat_params(net):
    """Return all parameters as one flat tensor (on the parameters' device)."""
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def save_checkpoint(path, net, optimizer, epoch):
    """Write a checkpoint atomically (notebook 3's d2lpar.save_checkpoint): old file or new."""
    d2lpar.save_checkpoint({'net': net.state_dict(), 'optimizer': optimizer.state_dict(),
                            'epoch': epoch}, path)


def load_checkpoint(path, net, optimizer, map_location):
    """Load a checkpoint onto `map_location`; return the epoch to continue from."""
    state = torch.load(path, map_location=map_location, weights_only=True)
    net.load_state_dict(state['net'])
    optimizer.load_state_dict(state['optimizer'])
    return state['epoch'] + 1
