"""Data: Fashion-MNIST in memory, with a loudly announced offline stand-in.

Layout under the data root (the repository's `data/` by default):

    FashionMNIST/raw/            the real data set, as torchvision downloads it
    standin/FashionMNIST/raw/    the generated stand-in, same IDX files, plus SHA256SUMS

Keeping the stand-in in its own root means it can never be mistaken for the
real data set, and torchvision's own FashionMNIST class reads both.
"""
import contextlib
import hashlib
import math
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import torch
from torch.nn import functional as F

from .checks import positive_int
from .devices import env_flag

__all__ = ['load_data_fashion_mnist', 'prepare_fashion_mnist', 'get_fashion_mnist_labels', 'TensorLoader',
           'data_root', 'fashion_mnist_source', 'make_standin', 'offline']

FILES = {  # name: (IDX magic number, number of items)
    'train-images-idx3-ubyte': (0x803, 60000),
    'train-labels-idx1-ubyte': (0x801, 60000),
    't10k-images-idx3-ubyte': (0x803, 10000),
    't10k-labels-idx1-ubyte': (0x801, 10000),
}
# Fashion-MNIST is balanced: 6,000 images of each class in train, 1,000 in test.
PER_CLASS = {'train-labels-idx1-ubyte': 6000, 't10k-labels-idx1-ubyte': 1000}
MANIFEST = 'SHA256SUMS'
STANDIN_SEED = 20240601
TEXT_LABELS = ('t-shirt', 'trouser', 'pullover', 'dress', 'coat',
               'sandal', 'shirt', 'sneaker', 'bag', 'ankle boot')


def get_fashion_mnist_labels(labels):
    """Return text labels for the Fashion-MNIST dataset."""
    if isinstance(labels, (str, bytes)) or not hasattr(labels, '__iter__') or (
            isinstance(labels, torch.Tensor) and labels.dim() != 1):
        raise TypeError(f'get_fashion_mnist_labels: labels must be a list or 1-d tensor of '
                        f'class indices 0..9, got {labels!r}')
    labels = labels.tolist() if isinstance(labels, torch.Tensor) else list(labels)
    odd = [i for i in labels if isinstance(i, bool) or not isinstance(i, int)]
    if odd:
        raise TypeError(f'get_fashion_mnist_labels: labels must be class indices (ints), got '
                        f'{odd[0]!r}')
    bad = [i for i in labels if not 0 <= i < len(TEXT_LABELS)]
    if bad:
        raise ValueError(f'get_fashion_mnist_labels: Fashion-MNIST labels are 0..'
                         f'{len(TEXT_LABELS) - 1}, got {bad[:5]}')
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


# ---------------------------------------------------------------- IDX files

def _idx_bytes(array, magic):
    header = struct.pack('>I', magic) + b''.join(struct.pack('>I', d) for d in array.shape)
    return header + array.contiguous().numpy().tobytes()


def _idx_problem(path, magic, count):
    """Return why `path` is not a well-formed IDX file of `count` items, or None."""
    if not path.is_file():
        return f'{path.name} is missing'
    ndim = 3 if magic == 0x803 else 1
    with open(path, 'rb') as f:
        header = f.read(4 + 4 * ndim)
    if len(header) < 4 + 4 * ndim:
        return f'{path.name} is truncated (no complete header)'
    got_magic, *dims = struct.unpack(f'>{1 + ndim}I', header)
    if got_magic != magic:
        return f'{path.name} has magic number {got_magic:#x}, expected {magic:#x}'
    want_dims = [count, 28, 28][:ndim]
    if dims != want_dims:
        return f'{path.name} has shape {dims}, expected {want_dims}'
    size = path.stat().st_size
    if size != len(header) + math.prod(dims):
        return f'{path.name} has {size} bytes, expected {len(header) + math.prod(dims)}'
    return None


def _files_problem(raw):
    for name, (magic, count) in FILES.items():
        problem = _idx_problem(raw / name, magic, count)
        if problem:
            return problem
    return None


def _real_problem(raw):
    """Return why `raw` does not hold the real Fashion-MNIST, or None.

    What can be checked offline: each file's header, shape and exact size, the
    label counts (6,000 per class in train, 1,000 in test), and, where the
    downloaded archives are still present, torchvision's recorded MD5 of each.
    A garbage body of an image file that keeps the header passes: the images'
    own checksums are not recorded anywhere offline.
    """
    problem = _files_problem(raw)
    if problem:
        return problem
    for name, per_class in PER_CLASS.items():
        labels = (raw / name).read_bytes()[8:]
        counts = [labels.count(bytes([c])) for c in range(10)]
        if sum(counts) != len(labels):
            return f'{name} holds labels outside 0..9'
        if counts != [per_class] * 10:
            return (f'{name} has {counts} labels of classes 0..9; Fashion-MNIST has '
                    f'{per_class} of each')
    archives = [a for a in raw.glob('*.gz')]
    if archives:
        from torchvision.datasets import FashionMNIST
        for archive, md5 in FashionMNIST.resources:
            if (raw / archive).is_file() and _digest(raw / archive, 'md5') != md5:
                return f'{archive} does not match the MD5 torchvision records for it ({md5})'
    return None


def _digest(path, algorithm='sha256'):
    h = hashlib.new(algorithm)
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def _sha256(path):
    return _digest(path, 'sha256')


def _atomic_write(path, payload):
    """Write bytes so that readers see either the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _remove_leftovers(directory):
    """Delete what interrupted writers left in `directory`, unless one is writing now.

    Writers hold the directory's lock, so a lock taken without waiting means
    every `.*.tmp` file and `.download-*` folder there belongs to a writer
    that was killed.
    """
    if not directory.is_dir():
        return []
    try:
        import fcntl
    except ImportError:
        return []
    removed = []
    with open(directory / '.lock', 'w') as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a writer is at work: its files are not leftovers
            return []
        try:
            for path in [*directory.glob('**/.*.tmp'), *directory.glob('.download-*')]:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                removed.append(path.name)
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    return removed


@contextlib.contextmanager
def _lock(directory):
    """Hold an exclusive lock on `directory` so two processes never prepare it at once."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: atomic writes alone keep every file whole.
        yield
        return
    with open(directory / '.lock', 'w') as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ------------------------------------------------------------- the stand-in

def _box(yy, xx, top, bottom, left, right):
    return ((yy >= top) & (yy < bottom) & (xx >= left) & (xx < right)).float()


def _silhouettes():
    """Return ten 28x28 templates, crude outlines of the ten Fashion-MNIST classes."""
    yy, xx = torch.meshgrid(torch.arange(28.), torch.arange(28.), indexing='ij')
    torso = _box(yy, xx, 5, 25, 8, 20)
    short_sleeves = _box(yy, xx, 5, 11, 3, 25)
    long_sleeves = _box(yy, xx, 5, 24, 3, 7) + _box(yy, xx, 5, 24, 21, 25) + _box(yy, xx, 5, 8, 3, 25)
    opening = _box(yy, xx, 6, 25, 13, 15)
    collar = _box(yy, xx, 5, 8, 11, 17)
    buttons = ((xx == 14) & (yy.remainder(4) == 1) & (yy > 8)).float()
    half_width = 3 + (yy - 4) * 0.35
    dress = ((yy >= 4) & (yy < 26) & ((xx - 13.5).abs() < half_width)).float()
    sole = _box(yy, xx, 20, 23, 2, 26)
    templates = [
        torso + short_sleeves,                                        # t-shirt
        _box(yy, xx, 3, 26, 8, 13) + _box(yy, xx, 3, 26, 15, 20) + _box(yy, xx, 3, 7, 8, 20),
        torso + long_sleeves,                                         # pullover
        dress,                                                        # dress
        torso + long_sleeves - 0.8 * opening,                         # coat
        sole + _box(yy, xx, 14, 16, 4, 24) + _box(yy, xx, 17, 19, 6, 22),   # sandal
        torso + long_sleeves + 0.6 * collar - 0.7 * buttons,          # shirt
        sole + _box(yy, xx, 14, 20, 4, 24) + _box(yy, xx, 11, 14, 13, 24),  # sneaker
        _box(yy, xx, 10, 25, 4, 24) + _box(yy, xx, 4, 10, 9, 11) + _box(yy, xx, 4, 10, 17, 19)
        + _box(yy, xx, 4, 6, 9, 19),                                  # bag
        sole + _box(yy, xx, 4, 20, 14, 24) + _box(yy, xx, 13, 20, 4, 14),   # ankle boot
    ]
    templates = torch.stack(templates).clamp(0, 1).unsqueeze(1)
    return F.avg_pool2d(templates, 3, stride=1, padding=1)  # soften the edges


def _standin_images(labels, generator):
    """Draw one 28x28 uint8 image per label from its class silhouette.

    Every sample gets a random shift, scale, rotation, contrast, texture and
    pixel noise, so a LeNet learns it well above chance but not perfectly;
    the tops (t-shirt, pullover, coat, shirt) are easy to confuse, as in the
    real data set.
    """
    g = generator
    n = len(labels)
    scale = 1 + 0.1 * torch.randn(n, generator=g)
    angle = 0.12 * torch.randn(n, generator=g)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = scale * torch.cos(angle)
    theta[:, 0, 1] = -scale * torch.sin(angle)
    theta[:, 1, 0] = scale * torch.sin(angle)
    theta[:, 1, 1] = scale * torch.cos(angle)
    theta[:, :, 2] = 0.1 * torch.randn(n, 2, generator=g)
    grid = F.affine_grid(theta, (n, 1, 28, 28), align_corners=False)
    images = F.grid_sample(_silhouettes()[labels], grid, align_corners=False)
    texture = F.interpolate(torch.rand(n, 1, 7, 7, generator=g), size=(28, 28),
                            mode='bilinear', align_corners=False)
    contrast = 0.5 + 0.5 * torch.rand(n, 1, 1, 1, generator=g)
    images = contrast * images * (0.4 + 0.8 * texture) + 0.15 * torch.randn(n, 1, 28, 28, generator=g)
    return (images.clamp(0, 1) * 255).round().to(torch.uint8).squeeze(1)


def make_standin(raw):
    """Generate the stand-in's four IDX files and their SHA256SUMS into `raw`."""
    raw = Path(raw)
    raw.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(STANDIN_SEED)
    sums = []
    for split in ('train', 't10k'):
        count = FILES[f'{split}-labels-idx1-ubyte'][1]
        labels = torch.randint(0, 10, (count,), generator=g)
        images = _standin_images(labels, g)
        # Relabel a few samples at random: the ceiling stays below 100%.
        flip = torch.rand(count, generator=g) < 0.03
        labels = torch.where(flip, torch.randint(0, 10, (count,), generator=g), labels)
        for name, array, magic in ((f'{split}-images-idx3-ubyte', images, 0x803),
                                   (f'{split}-labels-idx1-ubyte', labels.to(torch.uint8), 0x801)):
            _atomic_write(raw / name, _idx_bytes(array, magic))
            sums.append(f'{_sha256(raw / name)}  {name}\n')
    # The manifest is written last: its presence means all four files are whole.
    _atomic_write(raw / MANIFEST, ''.join(sums).encode())


def _standin_problem(raw):
    problem = _files_problem(raw)
    if problem:
        return problem
    if not (raw / MANIFEST).is_file():
        return f'{MANIFEST} is missing'
    for line in (raw / MANIFEST).read_text().splitlines():
        digest, _, name = line.partition('  ')
        if name not in FILES or _sha256(raw / name) != digest:
            return f'{name} does not match its checksum in {MANIFEST}'
    return None


def _prepare_standin(root):
    raw = root / 'standin' / 'FashionMNIST' / 'raw'
    if _standin_problem(raw) is None:
        return raw
    with _lock(raw.parent):
        problem = _standin_problem(raw)  # another process may have made it meanwhile
        if problem:
            if (raw / MANIFEST).exists() or any((raw / n).exists() for n in FILES):
                print(f'Regenerating the Fashion-MNIST stand-in: {problem}.', file=sys.stderr)
            make_standin(raw)
    return raw


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
            print(f'Fashion-MNIST in {raw} is damaged ({problem}); downloading it again.',
                  file=sys.stderr)
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
    print(f'{bar}\n! Using the generated Fashion-MNIST STAND-IN, not the real data set.\n'
          f'! Reason: {reason}\n'
          f'! Shapes and classes match, accuracies will not. For the real data, go\n'
          f'! online and unset D2LPAR_OFFLINE, or copy the four IDX files into\n'
          f'! data/FashionMNIST/raw/ (see data/README.md).\n{bar}', file=sys.stderr)


# ------------------------------------------------------------------ loading

class TensorLoader:
    """Iterate over minibatches of in-memory tensors (a light DataLoader).

    Shuffling draws from torch's global generator, so `torch.manual_seed`
    makes an epoch's order reproducible, as it does for DataLoader.
    """

    def __init__(self, X, y, batch_size, shuffle=False, resize=None):
        if not isinstance(X, torch.Tensor) or not isinstance(y, torch.Tensor) \
                or X.dim() == 0 or y.dim() == 0:
            raise TypeError(f'TensorLoader: X and y must be tensors with a batch dimension, got '
                            f'{type(X).__name__} and {type(y).__name__}')
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
                isinstance(resize, (tuple, list)) and len(resize) == 2
                and all(isinstance(r, int) and not isinstance(r, bool) and r > 0
                        for r in resize)):
            raise ValueError(f'resize must be None, a positive int or a (height, width) pair '
                             f'of positive ints, got {resize!r}')
        self.resize = resize

    def __len__(self):
        return math.ceil(len(self.X) / self.batch_size)

    def __iter__(self):
        n = len(self.X)
        order = torch.randperm(n) if self.shuffle else None
        for i in range(0, n, self.batch_size):
            if order is None:
                X, y = self.X[i:i + self.batch_size], self.y[i:i + self.batch_size]
            else:
                idx = order[i:i + self.batch_size]
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
            print(f'Removed what an interrupted write left in {folder}: {", ".join(removed)}',
                  file=sys.stderr)
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
    return (TensorLoader(*train, batch_size, shuffle=True, resize=resize),
            TensorLoader(*test, batch_size, shuffle=False, resize=resize))
