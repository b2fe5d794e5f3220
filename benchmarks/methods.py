"""Every training method of the course, on the same model and data: samples per second.

All methods train the functional `d2lpar.lenet` from the same initial parameters
on the same Fashion-MNIST minibatches of 256 (global batch: each of k workers
takes 256 / k of it), with SGD:

* single process: `d2lpar.train_batch` with one device slot;
* hand-written data parallel: `d2lpar.train_batch` with k slots (notebook 8);
* `nn.DataParallel` over k GPUs (skipped without 2 GPUs: on the CPU it only calls the module);
* DDP with k processes (gloo on the CPU, nccl with a GPU per process);
* the hand-written `d2lpar.MiniDDP` with k processes, in the same processes as DDP.

Every process computes with one thread, so k processes use k cores; one more
row shows a single process using all cores with torch's intra-op threads.
Only training steps are timed: best of several interleaved repetitions. The
table, a JSON file and a bar plot go to bench-results/. Goal: MiniDDP's step
time within 1.3x of DDP's.
"""

import argparse
import importlib.util
import math
import os
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import d2lpar
from d2lpar.machinery.saving import replace_whole

from ._results import save

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'notebooks' / 'scripts' / 'collectives_miniddp.py'


def lenet_module(params):
    """Return `d2lpar.lenet` as an nn.Module: the class the DDP worker script trains."""
    spec = importlib.util.spec_from_file_location('collectives_miniddp', SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # defines things only: main() runs under __main__
    return script.LeNet(params)


def data_source():
    """Say whether the batches came from the real Fashion-MNIST or the generated stand-in."""
    real = d2lpar.data_root() / 'FashionMNIST' / 'raw' / 'train-images-idx3-ubyte'
    return 'real Fashion-MNIST' if real.exists() else 'the generated Fashion-MNIST stand-in'


def slots_step(k, params, batches, lr, threads=1):
    """Return a function that times steps of `d2lpar.train_batch` on k device slots."""
    devices = d2lpar.device_slots(k, verbose=False)
    device_params = [d2lpar.get_params(params, d) for d in devices]

    def run(steps):
        torch.set_num_threads(threads)
        d2lpar.synchronize()
        start = time.perf_counter()
        for i in range(steps):
            X, y = batches[i % len(batches)]
            d2lpar.train_batch(X, y, device_params, devices, lr)
        d2lpar.synchronize()
        return (time.perf_counter() - start) / steps

    return run, devices


def data_parallel_step(k, params, batches, lr):
    """Return a function that times steps of nn.DataParallel over k GPUs."""
    net = nn.DataParallel(lenet_module(params).cuda(0), device_ids=list(range(k)))
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)

    def run(steps):
        torch.set_num_threads(1)
        d2lpar.synchronize()
        start = time.perf_counter()
        for i in range(steps):
            X, y = batches[i % len(batches)]
            optimizer.zero_grad()
            F.cross_entropy(net(X.cuda(0)), y.cuda(0)).backward()
            optimizer.step()
        d2lpar.synchronize()
        return (time.perf_counter() - start) / steps

    return run


def in_process(methods, steps, repeats):
    """Return {name: best seconds per step}, the methods interleaved and rotated."""
    names = list(methods)
    for name in names:  # warm-up: first convolutions set up kernels
        methods[name](2)
    best = dict.fromkeys(names, math.inf)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            best[name] = min(best[name], methods[name](steps))
        print(
            f'round {r + 1}/{repeats}: ' + ', '.join(f'{name} {t * 1e3:.1f} ms' for name, t in best.items()), flush=True
        )
    return best


def data_parallel_processes(gpus, batch_size):
    """Return the processes (or slots) to compare: one per GPU, at least 2, dividing the batch."""
    # collectives_miniddp.py refuses a batch that does not split evenly: 3 GPUs and 256 -> 2.
    return max((d for d in range(2, max(gpus, 2) + 1) if batch_size % d == 0), default=1)


def main(quick=False, batch_size=256, lr=0.2):
    steps, repeats, num_batches = (5, 2, 5) if quick else (20, 3, 20)
    gpus = d2lpar.num_gpus()
    k = data_parallel_processes(gpus, batch_size)
    if k < gpus:
        print(
            f'{gpus} GPUs, but a batch of {batch_size} splits evenly over {k} of them: the data-parallel rows use {k}',
            flush=True,
        )
    torch.manual_seed(0)  # the same minibatches every run
    train_iter, _ = d2lpar.load_data_fashion_mnist(batch_size)
    batches = [b for _, b in zip(range(num_batches), train_iter)]
    params = d2lpar.init_lenet_params(seed=0)

    # Every process runs one thread (the launcher sets OMP_NUM_THREADS=1 for DDP's),
    # so k processes use k cores; one more row shows a single process using all cores.
    default_threads = torch.get_num_threads()
    single, single_devices = slots_step(1, params, batches, lr)
    hand, hand_devices = slots_step(k, params, batches, lr)
    methods = {'single process': single}
    rows = {'single process': f'1 slot ({single_devices[0]})'}
    if default_threads > 1:
        name = f'single process, {default_threads} threads'
        methods[name] = slots_step(1, params, batches, lr, threads=default_threads)[0]
        rows[name] = f'1 slot ({single_devices[0]})'
    methods['hand-written data parallel'] = hand
    rows['hand-written data parallel'] = f'{k} slots ({", ".join(sorted({str(d) for d in hand_devices}))})'
    rows['nn.DataParallel'] = f'{k} GPUs'
    if gpus >= 2:
        methods['nn.DataParallel'] = data_parallel_step(k, params, batches, lr)
    try:
        seconds = in_process(methods, steps, repeats)
    finally:
        torch.set_num_threads(default_threads)

    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, 'batches.pt')
        batch = (torch.cat([X for X, _ in batches]), torch.cat([y for _, y in batches]))
        replace_whole(data, lambda tmp: torch.save(batch, tmp))  # the ranks read it whole
        run = d2lpar.launch(
            SCRIPT,
            nproc=k,
            timeout=900,
            args=[
                '--model',
                'lenet',
                '--data',
                data,
                '--batch-size',
                batch_size,
                '--lr',
                lr,
                '--time-steps',
                steps,
                '--repeats',
                repeats,
                '--buckets',
                25,
            ],
        ).check()
    report = run.by_rank()[0]
    backend, where = report['backend'], 'cuda' if report['device'].startswith('cuda') else 'cpu'
    seconds[f'DDP ({backend})'] = report['step_seconds']['DDP']
    seconds[f'MiniDDP ({backend})'] = report['step_seconds']['MiniDDP 25 MB']
    rows[f'DDP ({backend})'] = rows[f'MiniDDP ({backend})'] = f'{k} processes ({where})'

    base = seconds['single process']
    print(
        f'\ntraining LeNet, global batch {batch_size}, {steps} steps, best of {repeats}; '
        f'{d2lpar.hardware_tier()}, {os.cpu_count()} CPU cores, torch {torch.__version__}'
    )
    print(f'data: {data_source()}')
    print(f'{"method":28} {"workers":22} {"ms/step":>8} {"samples/s":>10} {"speed-up":>9}')
    table = []
    for name, workers in rows.items():
        if name not in seconds:
            print(f'{name:28} {workers:22} skipped: needs 2 GPUs (without them it only calls the module)')
            continue
        t = seconds[name]
        table.append(
            {
                'method': name,
                'workers': workers,
                'seconds_per_step': t,
                'samples_per_second': batch_size / t,
                'speedup': base / t,
            }
        )
        print(f'{name:28} {workers:22} {t * 1e3:8.1f} {batch_size / t:10.0f} {base / t:8.2f}x')
    ratio = seconds[f'MiniDDP ({backend})'] / seconds[f'DDP ({backend})']
    met = ratio <= 1.3
    print(f'goal: MiniDDP step time / DDP step time = {ratio:.2f}x (goal <= 1.3x) -> {"met" if met else "NOT met"}')

    save(
        'methods',
        {
            'hardware': d2lpar.hardware_tier(),
            'cpu_cores': os.cpu_count(),
            'torch': torch.__version__,
            'data': data_source(),
            'batch_size': batch_size,
            'steps': steps,
            'repeats': repeats,
            'table': table,
            'goal': {'miniddp_over_ddp': ratio, 'met': met},
        },
        plot(table),
    )
    return {'table': table, 'miniddp_over_ddp': ratio}


def plot(table):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 0.5 + 0.45 * len(table)))
    ax = fig.add_subplot()
    labels = [f'{row["method"]}\n{row["workers"]}' for row in table][::-1]
    ax.barh(labels, [row['samples_per_second'] for row in table][::-1])
    ax.set(xlabel='samples per second (LeNet training)', title=d2lpar.hardware_tier())
    fig.tight_layout()
    return fig


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--quick', action='store_true')
    main(quick=parser.parse_args().quick)
