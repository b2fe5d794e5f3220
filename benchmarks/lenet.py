"""LeNet training time: plain PyTorch SGD vs the hand-written data-parallel training loop.

All three variants train the same functional `d2lpar.lenet` from the same
parameters on the same minibatches (same seed, same batch size): the plain loop
uses autograd and `torch.optim.SGD` on one device, the hand-written one is the
loop `d2lpar.train` times, `d2lpar.train_batch` on every minibatch, with 1 and
with 2 device slots. Only the training loop is timed.
Goal: the hand-written loop with 1 slot costs at most 1.15x the plain loop.
"""

import argparse
import itertools
import statistics

import torch
from torch.nn import functional as F

import d2lpar


def plain_epoch(params, train_iter, lr, max_batches, device):
    """Time one epoch of single-device training with autograd and torch.optim.SGD."""
    params = d2lpar.get_params(params, device)
    optimizer = torch.optim.SGD(params, lr=lr)
    timer = d2lpar.Timer(device)
    for i, (X, y) in enumerate(train_iter):
        if i == max_batches:
            break
        X, y = X.to(device), y.to(device)
        optimizer.zero_grad()
        F.cross_entropy(d2lpar.lenet(X, params), y).backward()
        optimizer.step()
    return timer.stop()


def main(quick=False, batch_size=256, lr=0.2, full=False):
    train_iter, _ = d2lpar.load_data_fashion_mnist(batch_size)
    if full:
        rounds, chunk = 3, len(train_iter)
    else:
        rounds, chunk = (4, 10) if quick else (10, 20)
    params = d2lpar.init_lenet_params(seed=0)
    device = d2lpar.try_gpu()
    slots = [str(d) for d in d2lpar.device_slots(2, verbose=False)]

    def hand_written(k):
        def epoch():  # the loop that d2lpar.train times in each epoch
            devices = d2lpar.device_slots(k, verbose=False)
            device_params = [d2lpar.get_params(params, d) for d in devices]
            timer = d2lpar.Timer()
            for X, y in itertools.islice(train_iter, chunk):
                d2lpar.train_batch(X, y, device_params, devices, lr)
            return timer.stop()

        return epoch

    variants = {
        'plain autograd + torch.optim.SGD': lambda: plain_epoch(params, train_iter, lr, chunk, device),
        'd2lpar.train_batch, 1 slot': hand_written(1),
        'd2lpar.train_batch, 2 slots': hand_written(2),
    }
    names = list(variants)
    plain_epoch(params, train_iter, lr, 3, device)  # warm-up: the first convolutions set up kernels
    times = {name: [] for name in names}
    for r in range(rounds):
        # Short runs, interleaved and rotated so that no variant always goes first:
        # bursts of load from other jobs then hit every variant alike.
        for name in names[r % 3 :] + names[: r % 3]:
            torch.manual_seed(r)  # the same shuffled minibatches for every variant
            times[name].append(variants[name]())
    plain = times[names[0]]
    ratios = {name: statistics.median(t / p for t, p in zip(ts, plain)) for name, ts in times.items()}
    print(
        f'LeNet, batch {batch_size}: {rounds} interleaved rounds of {chunk} minibatches '
        f'per variant ({len(train_iter)} make an epoch); 2 slots = {slots}'
    )
    print(f'  {"":34s} {"s/epoch (median)":>16s} {"best":>7s}  {"ratio to plain":>14s}')
    for name, ts in times.items():
        per_epoch = len(train_iter) / chunk
        print(
            f'  {name:34s} {statistics.median(ts) * per_epoch:16.2f} {min(ts) * per_epoch:7.2f}  {ratios[name]:13.2f}x'
        )
    one, two = ratios[names[1]], ratios[names[2]]
    print('  (ratio = median over rounds of the time of a round / the plain loop\'s in that round)')
    print(
        f'  1-slot ratio {one:.2f}x (goal: at most 1.15x) -> {"met" if one <= 1.15 else "NOT met"}; '
        f'2-slot ratio {two:.2f}x (recorded, no goal)'
    )
    return {
        'plain_s_per_epoch': statistics.median(plain) * len(train_iter) / chunk,
        'one_slot_ratio': one,
        'two_slot_ratio': two,
    }


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--quick', action='store_true', help='4 rounds of 10 minibatches')
    parser.add_argument('--full', action='store_true', help='3 rounds of whole epochs')
    args = parser.parse_args()
    main(quick=args.quick, full=args.full)
