"""The data files on disk: IDX validation, whole-or-nothing writes and locks, and the stand-in.

d2lpar/data.py loads Fashion-MNIST; this module checks the IDX files it reads and generates
the offline stand-in (same files, same shapes, announced loudly wherever it is used).
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
            return f'{name} has {counts} labels of classes 0..9; Fashion-MNIST has {per_class} of each'
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
    yy, xx = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing='ij')
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
        torso + short_sleeves,  # t-shirt
        _box(yy, xx, 3, 26, 8, 13) + _box(yy, xx, 3, 26, 15, 20) + _box(yy, xx, 3, 7, 8, 20),
        torso + long_sleeves,  # pullover
        dress,  # dress
        torso + long_sleeves - 0.8 * opening,  # coat
        sole + _box(yy, xx, 14, 16, 4, 24) + _box(yy, xx, 17, 19, 6, 22),  # sandal
        torso + long_sleeves + 0.6 * collar - 0.7 * buttons,  # shirt
        sole + _box(yy, xx, 14, 20, 4, 24) + _box(yy, xx, 11, 14, 13, 24),  # sneaker
        _box(yy, xx, 10, 25, 4, 24)
        + _box(yy, xx, 4, 10, 9, 11)
        + _box(yy, xx, 4, 10, 17, 19)
        + _box(yy, xx, 4, 6, 9, 19),  # bag
        sole + _box(yy, xx, 4, 20, 14, 24) + _box(yy, xx, 13, 20, 4, 14),  # ankle boot
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
    texture = F.interpolate(torch.rand(n, 1, 7, 7, generator=g), size=(28, 28), mode='bilinear', align_corners=False)
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
        for name, array, magic in (
            (f'{split}-images-idx3-ubyte', images, 0x803),
            (f'{split}-labels-idx1-ubyte', labels.to(torch.uint8), 0x801),
        ):
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
