"""One epoch of Fashion-MNIST batches: d2lpar's in-memory loader vs d2l's DataLoader.

d2l reads the data set through `DataLoader(num_workers=4)` with a per-image
`ToTensor`, which decodes every image again each epoch in worker processes;
`d2lpar.load_data_fashion_mnist` converts the whole set once and slices tensors.
Goal: the in-memory loader is at least 10x faster.
"""

import argparse
import time
import warnings

import torchvision
from torch.utils import data as tud
from torchvision import transforms

import d2lpar
from d2lpar.data import prepare_fashion_mnist


def epoch_seconds(loader):
    start = time.perf_counter()
    rows = 0
    for X, y in loader:
        rows += len(y)
    return time.perf_counter() - start, rows


def main(quick=False, batch_size=256, repeats=None):
    repeats = repeats or (1 if quick else 3)
    train_iter, _ = d2lpar.load_data_fashion_mnist(batch_size)
    dataset = torchvision.datasets.FashionMNIST(
        prepare_fashion_mnist().parent.parent, train=True, transform=transforms.ToTensor()
    )
    # d2l's setting, kept on purpose; torch warns that 4 workers exceed 2 cores.
    warnings.filterwarnings('ignore', message='This DataLoader will create')
    workers = tud.DataLoader(dataset, batch_size, shuffle=True, num_workers=4)
    ours, theirs = [], []
    for _ in range(repeats):  # interleaved, so background noise hits both alike
        seconds, rows = epoch_seconds(train_iter)
        ours.append(seconds)
        seconds, rows_dl = epoch_seconds(workers)
        theirs.append(seconds)
        assert rows == rows_dl == len(dataset)
    best_ours, best_theirs = min(ours), min(theirs)
    print(f'one epoch, batch {batch_size}, {len(dataset)} images, best of {repeats}:')
    print(f'  d2lpar in-memory loader          {best_ours:8.3f} s')
    print(f'  DataLoader(num_workers=4)+ToTensor {best_theirs:6.3f} s')
    ratio = best_theirs / best_ours
    print(f'  speed-up {ratio:.1f}x (goal: at least 10x) -> {"met" if ratio >= 10 else "NOT met"}')
    return {'in_memory_s': best_ours, 'dataloader_s': best_theirs, 'ratio': ratio}


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--quick', action='store_true')
    main(quick=parser.parse_args().quick)
