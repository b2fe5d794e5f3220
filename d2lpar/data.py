"""Data: Fashion-MNIST in memory, with a loudly announced offline stand-in.

Layout under the data root (the repository's `data/` by default):

    FashionMNIST/raw/            the real data set, as torchvision downloads it
    standin/FashionMNIST/raw/    the generated stand-in, same IDX files, plus SHA256SUMS

Keeping the stand-in in its own root means it can never be mistaken for the
real data set, and torchvision's own FashionMNIST class reads both.
"""

import math
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.nn import functional as F

from .checks import positive_int
from .data_files import FILES, _lock, _prepare_standin, _real_problem, _remove_leftovers, make_standin
from .devices import env_flag

__all__ = [
    'load_data_fashion_mnist',
    'prepare_fashion_mnist',
    'get_fashion_mnist_labels',
    'TensorLoader',
    'data_root',
    'fashion_mnist_source',
    'make_standin',
    'offline',
]

TEXT_LABELS = ('t-shirt', 'trouser', 'pullover', 'dress', 'coat', 'sandal', 'shirt', 'sneaker', 'bag', 'ankle boot')


def get_fashion_mnist_labels(labels):
    """Return text labels for the Fashion-MNIST dataset."""
    if (
        isinstance(labels, (str, bytes))
        or not hasattr(labels, '__iter__')
        or (isinstance(labels, torch.Tensor) and labels.dim() != 1)
    ):
        raise TypeError(
            f'get_fashion_mnist_labels: labels must be a list or 1-d tensor of class indices 0..9, got {labels!r}'
        )
    labels = labels.tolist() if isinstance(labels, torch.Tensor) else list(labels)
    odd = [i for i in labels if isinstance(i, bool) or not isinstance(i, int)]
    if odd:
        raise TypeError(f'get_fashion_mnist_labels: labels must be class indices (ints), got {odd[0]!r}')
    bad = [i for i in labels if not 0 <= i < len(TEXT_LABELS)]
    if bad:
        raise ValueError(f'get_fashion_mnist_labels: Fashion-MNIST labels are 0..{len(TEXT_LABELS) - 1}, got {bad[:5]}')
    return [TEXT_LABELS[i] for i in labels]


def data_root():
    """Return the data directory: $D2LPAR_DATA, else the repository's data/."""
    if os.environ.get('D2LPAR_DATA'):
        return Path(os.environ['D2LPAR_DATA']).expanduser()
    repo_data = Path(__file__).resolve().parent.parent / 'data'
    return repo_data if repo_data.is_dir() else Path.cwd() / 'data'


def offline():
    """Return True when D2LPAR_OFFLINE=1 asks never to download."""
    return env_flag('D2LPAR_OFFLINE')


# --------------------------------------------------------- the real data set


def _prepare_real(root):
    """Return the raw folder of the real data set, downloading it if needed."""
    import torchvision

    raw = root / 'FashionMNIST' / 'raw'
    if _real_problem(raw) is None:
        return raw
    with _lock(root / 'FashionMNIST'):
        problem = _real_problem(raw)
        if problem is None:
            return raw
        if any((raw / n).exists() for n in FILES):
            print(f'Fashion-MNIST in {raw} is damaged ({problem}); downloading it again.', file=sys.stderr)
        # Download into a scratch root and move each checked file into place, so
        # an interrupted download never leaves a half-written file behind.
        with tempfile.TemporaryDirectory(dir=root / 'FashionMNIST', prefix='.download-') as scratch:
            for train in (True, False):
                torchvision.datasets.FashionMNIST(scratch, train=train, download=True)
            fresh = Path(scratch) / 'FashionMNIST' / 'raw'
            problem = _real_problem(fresh)
            if problem:
                raise RuntimeError(f'the downloaded Fashion-MNIST is not valid: {problem}')
            raw.mkdir(parents=True, exist_ok=True)
            for name in FILES:
                os.replace(fresh / name, raw / name)
    return raw


def fashion_mnist_source(root=None):
    """Describe which Fashion-MNIST the loader will use, without downloading."""
    root = Path(root) if root else data_root()
    if _real_problem(root / 'FashionMNIST' / 'raw') is None:
        return f'real Fashion-MNIST in {root}'
    if offline():
        return 'generated stand-in (D2LPAR_OFFLINE=1), not the real Fashion-MNIST'
    return f'real Fashion-MNIST, to be downloaded into {root} (stand-in if that fails)'


def _warn_standin(reason):
    bar = '!' * 78
    print(
        f'{bar}\n! Using the generated Fashion-MNIST STAND-IN, not the real data set.\n'
        f'! Reason: {reason}\n'
        f'! Shapes and classes match, accuracies will not. For the real data, go\n'
        f'! online and unset D2LPAR_OFFLINE, or copy the four IDX files into\n'
        f'! data/FashionMNIST/raw/ (see data/README.md).\n{bar}',
        file=sys.stderr,
    )


# ------------------------------------------------------------------ loading


class TensorLoader:
    """Iterate over minibatches of in-memory tensors (a light DataLoader).

    Shuffling draws from torch's global generator, so `torch.manual_seed`
    makes an epoch's order reproducible, as it does for DataLoader.
    """

    def __init__(self, X, y, batch_size, shuffle=False, resize=None):
        if not isinstance(X, torch.Tensor) or not isinstance(y, torch.Tensor) or X.dim() == 0 or y.dim() == 0:
            raise TypeError(
                f'TensorLoader: X and y must be tensors with a batch dimension, got '
                f'{type(X).__name__} and {type(y).__name__}'
            )
        positive_int(batch_size, 'TensorLoader: batch_size')
        if len(X) != len(y):
            raise ValueError(f'X has {len(X)} rows but y has {len(y)}')
        self.X, self.y = X, y
        # As DataLoader's: d2l code asks len(train_iter.dataset) for the number of examples.
        self.dataset = torch.utils.data.TensorDataset(X, y)
        self.batch_size, self.shuffle = batch_size, shuffle
        if isinstance(resize, int) and not isinstance(resize, bool):
            resize = (resize, resize)
        if resize is not None and not (
            isinstance(resize, (tuple, list))
            and len(resize) == 2
            and all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in resize)
        ):
            raise ValueError(
                f'resize must be None, a positive int or a (height, width) pair of positive ints, got {resize!r}'
            )
        self.resize = resize

    def __len__(self):
        return math.ceil(len(self.X) / self.batch_size)

    def __iter__(self):
        n = len(self.X)
        order = torch.randperm(n) if self.shuffle else None
        for i in range(0, n, self.batch_size):
            if order is None:
                X, y = self.X[i : i + self.batch_size], self.y[i : i + self.batch_size]
            else:
                idx = order[i : i + self.batch_size]
                X, y = self.X[idx], self.y[idx]
            if self.resize:
                X = F.interpolate(X, size=self.resize, mode='bilinear', align_corners=False)
            yield X, y


def _read(raw, train):
    import torchvision

    # torchvision reads ROOT/FashionMNIST/raw; both our layouts end that way.
    ds = torchvision.datasets.FashionMNIST(raw.parent.parent, train=train, download=False)
    if int(ds.targets.max()) > 9:
        raise RuntimeError(f'{raw} holds labels above 9; delete the folder and load again')
    return ds.data.unsqueeze(1).float().div_(255), ds.targets


def prepare_fashion_mnist(root=None):
    """Return the raw folder of the Fashion-MNIST to use, downloading or generating it.

    Downloads the real data set into the data root the first time. When that
    is impossible (no network) or D2LPAR_OFFLINE=1 is set, it generates a
    deterministic stand-in with the same files and shapes and says so loudly
    every time.
    """
    root = Path(root) if root else data_root()
    root.mkdir(parents=True, exist_ok=True)
    for folder in (root / 'FashionMNIST', root / 'standin' / 'FashionMNIST'):
        removed = _remove_leftovers(folder)
        if removed:
            print(f'Removed what an interrupted write left in {folder}: {", ".join(removed)}', file=sys.stderr)
    real = root / 'FashionMNIST' / 'raw'
    damage = _real_problem(real) if any((real / n).exists() for n in FILES) else None
    if damage is None and real.is_dir() and all((real / n).exists() for n in FILES):
        return real
    if offline():
        reason = 'D2LPAR_OFFLINE=1 is set (it asks for no download)'
    else:
        try:
            return _prepare_real(root)
        except Exception as e:  # any failure to download means: fall back, loudly
            reason = f'the download failed ({type(e).__name__}: {str(e).splitlines()[0]})'
    if damage:
        reason += f'; the real data set in {real} is unusable: {damage}'
    _warn_standin(reason)
    return _prepare_standin(root)


def load_data_fashion_mnist(batch_size, resize=None, root=None):
    """Load Fashion-MNIST into memory and return (train_iter, test_iter).

    See `prepare_fashion_mnist` for where the data comes from.
    """
    positive_int(batch_size, 'batch_size')
    raw = prepare_fashion_mnist(root)
    train, test = _read(raw, True), _read(raw, False)
    return (
        TensorLoader(*train, batch_size, shuffle=True, resize=resize),
        TensorLoader(*test, batch_size, shuffle=False, resize=resize),
    )
