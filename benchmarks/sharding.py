"""Sharded data parallelism: DDP, hand ZeRO-1/2/3 (d2lpar.sharding) and FSDP2 side by side.

Runs `notebooks/scripts/sharding_bench.py` through `d2lpar.launch` with 2 and 4
processes (gloo, CPU) on the same MLP: the step time (median, slowest rank) and
the per-rank bytes of parameters, gradients and optimizer state (and RSS).
Goals: FSDP2's per-rank model-state bytes within 10% of 1/N of DDP's; hand
ZeRO-3's step time at most 1.5x FSDP2's.
"""
import json
from pathlib import Path

import d2lpar

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'notebooks' / 'scripts' / 'sharding_bench.py'
RESULTS = ROOT / 'bench-results'
METHODS = ['DDP', 'Zero1', 'Zero2', 'Zero3', 'FSDP2']


def plot(runs, path):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(9, 3.4))
    for i, key in enumerate(('seconds', 'bytes')):
        ax = fig.add_subplot(1, 2, i + 1)
        for j, (n, r) in enumerate(runs.items()):
            ax.bar([k + 0.4 * j for k in range(len(METHODS))],
                   [r['results'][m][key] for m in METHODS], width=0.4, label=f'{n} processes')
        ax.set_xticks([k + 0.2 for k in range(len(METHODS))], METHODS)
        ax.set(ylabel=key if key == 'seconds' else 'model-state bytes per rank',
               title='step time' if key == 'seconds' else 'memory per rank')
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(quick=False):
    width, steps = (256, 3) if quick else (512, 8)
    runs = {}
    for n in (2, 4):
        print(f'--- {n} processes', flush=True)
        run = d2lpar.launch(SCRIPT, nproc=n, args=['--width', width, '--steps', steps],
                            timeout=900).check()
        runs[n] = run.by_rank()[0]
    print(f'\nMLP of width {width} on {d2lpar.hardware_tier()} (gloo); ratios to DDP:')
    goals = []
    for n, r in runs.items():
        res = r['results']
        ddp = res['DDP']
        print(f'{n} processes' + ''.join(f'{m:>16}' for m in METHODS))
        print('  step ms  ' + ''.join(f'{res[m]["seconds"] * 1e3:9.1f} ({res[m]["seconds"] / ddp["seconds"]:4.2f}x)'
                                      for m in METHODS))
        print('  state KB ' + ''.join(f'{res[m]["bytes"] / 2**10:9.0f} ({res[m]["bytes"] / ddp["bytes"]:4.2f}x)'
                                      for m in METHODS))
        print('  RSS MB   ' + ''.join(f'{res[m]["rss"] / 2**20:16.0f}' for m in METHODS))
        ratio = res['FSDP2']['bytes'] / (ddp['bytes'] / n)
        goals.append((f"{n} processes: FSDP2 state bytes / (DDP's / N) within 10% of 1",
                      ratio, abs(ratio - 1) <= 0.10))
        ratio = res['Zero3']['seconds'] / res['FSDP2']['seconds']
        goals.append((f'{n} processes: hand ZeRO-3 step time / FSDP2 at most 1.5', ratio, ratio <= 1.5))
    print('goals:')
    for text, ratio, met in goals:
        print(f'  {text}: {ratio:.2f}x -> {"met" if met else "NOT met"}')
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / 'sharding.json').write_text(json.dumps(
        {'width': width, 'runs': {str(n): r for n, r in runs.items()},
         'goals': [{'goal': g, 'ratio': r, 'met': m} for g, r, m in goals]}, indent=1))
    plot(runs, RESULTS / 'sharding.png')
    print(f'saved {RESULTS / "sharding.json"} and {RESULTS / "sharding.png"}')
    return {'runs': runs, 'goals': goals}
