"""Allreduce: the hand-written naive and ring allreduce of `d2lpar.collectives` vs the built-in.

Runs `notebooks/scripts/collectives_timing.py` through `d2lpar.launch` with 2, 3
and 4 processes (gloo, CPU) over message sizes from 4 KB to 32 MB. Each time is
the best of several interleaved repetitions of the slowest rank's time;
bandwidths are nccl-tests' algbw = S/t and busbw = algbw * 2(n-1)/n.
Goals: the ring within 2x of the built-in all_reduce for messages of 1 MB and
more at every world size, and faster than the naive allreduce at world sizes 3
and 4 for large messages (8 MB and more).
"""

import argparse
from pathlib import Path

import d2lpar
from d2lpar import collectives

from ._results import save

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'notebooks' / 'scripts' / 'collectives_timing.py'
METHODS = ['naive', 'ring', 'built-in']
MB = 2**20


def measure(world_sizes, sizes, repeats):
    """Return {world size: {(method, bytes): seconds}} from one launch per world size."""
    timings = {}
    for n in world_sizes:
        print(f'--- {n} processes', flush=True)
        run = d2lpar.launch(SCRIPT, nproc=n, args=['--sizes', *sizes, '--repeats', repeats], timeout=900).check()
        timings[n] = {(r['method'], r['bytes']): r['seconds'] for r in run.by_rank()[0]['timings']}
    return timings


def goals(timings, sizes):
    """Return the goal lines: (text, ratio, met)."""
    lines = []
    for n, table in timings.items():
        large = [S for S in sizes if S >= MB]
        if large:
            ratio = max(table['ring', S] / table['built-in', S] for S in large)
            lines.append((f'{n} processes: ring / built-in, worst over >= 1 MB', ratio, ratio <= 2))
        larger = [S for S in sizes if S >= 8 * MB]
        if n >= 3 and larger:
            ratio = min(table['naive', S] / table['ring', S] for S in larger)
            lines.append((f'{n} processes: naive / ring, worst over >= 8 MB', ratio, ratio > 1))
    return lines


def plot(timings):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(timings), 3.4))
    for i, (n, table) in enumerate(timings.items()):
        ax = fig.add_subplot(1, len(timings), i + 1)
        for method, fmt in zip(METHODS, ['o-', 's-', '^--']):
            points = sorted((S, t) for (m, S), t in table.items() if m == method)
            ax.plot([S for S, _ in points], [t for _, t in points], fmt, label=method)
        ax.set(
            xscale='log',
            yscale='log',
            xlabel='message size (bytes)',
            ylabel='seconds',
            title=f'allreduce, {n} processes',
        )
        ax.grid(True, which='both', alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def main(quick=False):
    if quick:
        sizes, repeats = [64 * 2**10, MB, 8 * MB], 2
    else:
        sizes, repeats = [2**12 * 4**i for i in range(7)] + [32 * MB], 5  # 4 KB .. 16 MB, 32 MB
    world_sizes = [2, 3, 4]
    timings = measure(world_sizes, sizes, repeats)
    print(f'\nallreduce of float32 messages on {d2lpar.hardware_tier()} (gloo), best of {repeats}:')
    for n, table in timings.items():
        print(
            f'{n} processes'
            + ''.join(f'{m + " ms":>12}' for m in METHODS)
            + ''.join(f'{m + " busbw":>16}' for m in METHODS)
        )
        for S in sizes:
            busbw = [collectives.bandwidths(S, table[m, S], n)[1] / 1e6 for m in METHODS]
            print(
                f'{S / 2**10:8.0f} KB'
                + ''.join(f'{table[m, S] * 1e3:12.2f}' for m in METHODS)
                + ''.join(f'{b:11.0f} MB/s' for b in busbw)
            )
    print('goals:')
    lines = goals(timings, sizes)
    for text, ratio, met in lines:
        print(f'  {text}: {ratio:.2f}x -> {"met" if met else "NOT met"}')
    records = [
        {'world_size': n, 'method': m, 'bytes': S, 'seconds': t}
        for n, table in timings.items()
        for (m, S), t in table.items()
    ]
    save(
        'collectives',
        {
            'hardware': d2lpar.hardware_tier(),
            'repeats': repeats,
            'timings': records,
            'goals': [{'goal': g, 'ratio': r, 'met': m} for g, r, m in lines],
        },
        plot(timings),
    )
    return {'timings': records, 'goals': lines}


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--quick', action='store_true')
    main(quick=parser.parse_args().quick)
