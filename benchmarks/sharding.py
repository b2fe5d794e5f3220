"""Sharded data parallelism: DDP, hand ZeRO-1/2/3 (d2lpar.zero) and FSDP2 side by side.

Runs `notebooks/scripts/sharding_bench.py` through `d2lpar.launch` with 2 and 4
processes (gloo, CPU) on the same MLP: the step time (median, slowest rank) and the
peak bytes a rank holds over one whole step (d2lpar.memory.StepMemory), with
notebook 10's model-state formula next to it.
Goals: each ZeRO stage's peak below the one before (DDP > ZeRO-1 > ZeRO-2 > ZeRO-3);
FSDP2's peak within 5 layers of the ZeRO-3 formula; hand ZeRO-3's step time at most
1.5x FSDP2's.
"""

from pathlib import Path

import d2lpar
from d2lpar.zero import model_state_bytes

from ._results import save

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'notebooks' / 'scripts' / 'sharding_bench.py'
METHODS = ['torch DDP', 'hand DDP', 'ZeRO-1', 'ZeRO-2', 'ZeRO-3', 'FSDP2']
STAGE = {
    'torch DDP': 'ddp',
    'hand DDP': 'ddp',
    'ZeRO-1': 'zero1',
    'ZeRO-2': 'zero2',
    'ZeRO-3': 'zero3',
    'FSDP2': 'zero3',
}


def plot(runs):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.4))
    for i, key in enumerate(('seconds', 'peak')):
        ax = fig.add_subplot(1, 2, i + 1)
        for j, (n, r) in enumerate(runs.items()):
            ax.bar(
                [k + 0.4 * j for k in range(len(METHODS))],
                [r['results'][m][key] for m in METHODS],
                width=0.4,
                label=f'{n} processes',
            )
        ax.set_xticks([k + 0.2 for k in range(len(METHODS))], METHODS, fontsize=7)
        ax.set(
            ylabel='seconds' if key == 'seconds' else 'peak bytes per rank',
            title='step time' if key == 'seconds' else 'peak memory over a step',
        )
        ax.legend()
    fig.tight_layout()
    return fig


def main(quick=False):
    width, steps = (256, 3) if quick else (512, 8)
    runs = {}
    for n in (2, 4):
        print(f'--- {n} processes', flush=True)
        run = d2lpar.launch(SCRIPT, nproc=n, args=['--width', width, '--steps', steps], timeout=900).check()
        runs[n] = run.by_rank()[0]
    print(f'\nMLP of width {width} on {d2lpar.hardware_tier()} (gloo); ratios to torch DDP:')
    goals = []
    for n, r in runs.items():
        res, P, layer = r['results'], r['num_params'], r['layer_bytes']
        ddp = res['torch DDP']
        print(f'{n} processes  ' + ''.join(f'{m:>17}' for m in METHODS))
        print(
            '  step ms    '
            + ''.join(f'{res[m]["seconds"] * 1e3:10.1f} ({res[m]["seconds"] / ddp["seconds"]:4.2f}x)' for m in METHODS)
        )
        print(
            '  peak KiB   '
            + ''.join(f'{res[m]["peak"] / 2**10:10.0f} ({res[m]["peak"] / ddp["peak"]:4.2f}x)' for m in METHODS)
        )
        print('  formula KiB' + ''.join(f'{model_state_bytes(STAGE[m], P, n) / 2**10:17.0f}' for m in METHODS))
        peaks = [res[m]['peak'] for m in ('hand DDP', 'ZeRO-1', 'ZeRO-2', 'ZeRO-3')]
        goals.append(
            (
                f'{n} processes: hand DDP > ZeRO-1 > ZeRO-2 > ZeRO-3 peaks (ZeRO-3/DDP)',
                peaks[3] / peaks[0],
                peaks == sorted(peaks, reverse=True),
            )
        )
        extra = (res['FSDP2']['peak'] - model_state_bytes('zero3', P, n)) / layer
        goals.append((f'{n} processes: FSDP2 peak above the ZeRO-3 formula, in layers (<= 5)', extra, 0 <= extra <= 5))
        ratio = res['ZeRO-3']['seconds'] / res['FSDP2']['seconds']
        goals.append((f'{n} processes: hand ZeRO-3 step time / FSDP2 at most 1.5', ratio, ratio <= 1.5))
    print('goals:')
    for text, ratio, met in goals:
        print(f'  {text}: {ratio:.2f} -> {"met" if met else "NOT met"}')
    save(
        'sharding',
        {
            'width': width,
            'runs': {str(n): r for n, r in runs.items()},
            'goals': [{'goal': g, 'ratio': r, 'met': m} for g, r, m in goals],
        },
        plot(runs),
    )
    return {'runs': runs, 'goals': goals}
