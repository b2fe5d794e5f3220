"""What the scripts notebooks 10-14 write (%%writefile) must hand back, by script name."""

from .checks import _expect


def _check_tp_block(results, args):
    """Notebook 12's facts after tp_sp.py: equal to one process, four all-reduces."""
    for rank, r in results.items():
        for name in ('megatron', 'sp'):
            worst = max(r[name]['out'], r[name]['x_grad'], r[name]['grads'])
            _expect(worst < 1e-5, f'rank {rank}: {name} differs from one process by {worst:.1e}')
        if len(results) > 1:  # one rank sees every token: its partial gradient is the whole
            _expect(
                r['sp']['partial'] > 0.1,
                f'rank {rank}: a norm gradient before the sum '
                'equals the whole one (the ranks did not see different tokens)',
            )
        calls = {k: c for k, (c, _) in r['megatron']['calls'].items()}
        _expect(calls == {'all_reduce': 4}, f'rank {rank}: Megatron collectives {calls}')
        _expect(r['overlap_equal'], f'rank {rank}: overlapped backward changed the gradients')


def _check_tp_dtensor(results, args):
    """Notebook 13's facts after tp_loss.py: DTensor plans = Megatron by hand = one process."""
    for rank, r in results.items():
        lp = r['loss_parallel']
        diffs = [r['tp']['diff'], r['sp']['diff'], lp['grads'], abs(lp['loss'] - lp['want'])]
        _expect(max(diffs) < 1e-5, f'rank {rank}: differences {diffs}')
        if len(results) == 1:  # one rank: DTensor issues no collective at all (seen: {})
            continue
        _expect(
            r['tp']['collectives'] == {'all_reduce': 6},
            f"rank {rank}: tensor-parallel collectives {r['tp']['collectives']}",
        )
        _expect(
            r['sp']['collectives'] == {'all_gather_into_tensor': 4, 'reduce_scatter_tensor': 4},
            f"rank {rank}: sequence-parallel collectives {r['sp']['collectives']}",
        )


def _check_tp_costs(results, args):
    """Notebook 13's facts after tp_mfu.py: each strategy's collectives = block_bytes, MFU below 1."""
    from d2lpar.tensor_parallel import block_bytes

    r = results[0]
    want = block_bytes(r['params'], r['B'] * r['T'], r['D'], len(results), replicated=r['replicated'])
    for name, formula in want.items():
        sent = [sum(b for _, b in results[rank]['bytes'][name].values()) for rank in results]
        _expect(max(sent) == round(formula), f'{name}: ranks sent {sent} bytes, block_bytes says {formula:.0f}')
        flop = r['B'] * r['T'] * (6 * r['params'] + 12 * r['T'] * r['D']) * (2 if name == 'PP' else 1)
        mfu = flop / r['seconds'][name] / sum(results[rank]['peak'] for rank in results)
        _expect(0 < mfu < 1, f'{name}: MFU {mfu:.2f} against the measured peak')


def _one_process_pp(batch):
    """Notebook 14's reference: its network and batch trained unsplit; (loss, flat gradients)."""
    import torch
    from torch import nn

    torch.manual_seed(0)  # the script's make_net(): Linear-ReLU pairs, then a Linear
    layers = [nn.Linear(64, 32), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(32, 10))
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
    loss = nn.functional.cross_entropy(net(X), y)
    loss.backward()
    return loss.item(), [x for q in net.parameters() for x in q.grad.flatten().tolist()]


def _check_pp_schedules(results, args):
    """Notebook 14's facts after pp_schedules.py: every schedule = one process, in-flight peaks."""
    p = len(results)
    batch = int(args[args.index('--batch') + 1]) if '--batch' in args else 32
    want_loss, want = _one_process_pp(batch)
    m = sum(1 for e in results[0]['GPipe']['events'] if e[2] == 'F' and e[0] == 0)
    for name in [k for k, v in results[0].items() if isinstance(v, dict)]:  # the schedules
        by_stage = {i: g for r in results.values() for i, g in r[name]['grads'].items()}
        got = [x for i in sorted(by_stage, key=int) for t in by_stage[i] for x in _flatten(t)]
        _expect(
            len(got) == len(want) and max(abs(x - y) for x, y in zip(got, want)) < 1e-5,
            f'{name}: gradients differ from one process\'s',
        )
        losses = [r[name]['loss'] for r in results.values() if r[name]['loss'] is not None]
        _expect(
            len(losses) == 1 and abs(losses[0] - want_loss) < 1e-5,
            f'{name}: last-stage losses {losses}, one process {want_loss:.5f}',
        )
        _expect(
            all(r[name]['alive_after'] == 0 for r in results.values()), f'{name}: activations still held after the step'
        )
    peaks = {name: [results[r][name]['peak_in_flight'] for r in range(p)] for name in ('GPipe', '1F1B')}
    _expect(peaks['GPipe'] == [m] * p, f'GPipe holds {peaks["GPipe"]} micro-batches, not {m}')
    _expect(peaks['1F1B'] == [p - r for r in range(p)], f'1F1B holds {peaks["1F1B"]}')


def _check_parallel_3d(results, args):
    """Notebook 14's facts after parallel_3d.py: 3D = one process within rounding."""
    r = results[0]
    sizes = r['sizes']
    tolerance = sizes['LR'] * r['steps'] * sizes['B'] * sizes['T'] * sizes['H'] * 2.0**-23
    _expect(
        sorted((r['pp'], r['dp'], r['tp']) for r in results.values())
        == [(a, b, c) for a in range(2) for b in range(2) for c in range(2)],
        'mesh coordinates',
    )
    for rank, r in results.items():
        _expect(
            r['max_diff'] < tolerance < r['moved'] / 100,
            f"rank {rank}: off by {r['max_diff']:.1e}, tolerance {tolerance:.1e}, moved {r['moved']:.1e}",
        )
    rows = [results[rank]['mlp0_rows'] for rank in range(4)]
    _expect(rows == [[0, 8], [16, 24], [8, 16], [24, 32]], f'mlp.0 rows held {rows}')


def _flatten(value):
    if isinstance(value, list):
        return [x for v in value for x in _flatten(v)]
    return [value]


def _check_measure_zero(results, args):
    """Notebook 10's facts after measure_zero.py (which asserts parity with one process itself):
    the bytes each rank sent per stage, and peaks that fall stage by stage on 2 or more ranks."""
    n = len(results)
    for rank, r in results.items():
        passes = {'DDP': 2, 'ZeRO-1': 2, 'ZeRO-2': 2, 'ZeRO-3': 3}
        for stage, k in passes.items():
            want = k * (n - 1) / n * r['num_params'] * 4
            _expect(
                r['sent'][stage] == want, f"rank {rank}: {stage} sent {r['sent'][stage]} B, the ring sends {want:.0f}"
            )
        peaks = [r['peak'][stage] for stage in passes]
        if n == 1:  # one rank shards nothing: each stage only adds its own buffers
            continue
        _expect(
            peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4,
            f'rank {rank}: peaks {peaks} do not fall from DDP to ZeRO-3',
        )


def _check_fsdp_save(results, args):
    """Notebook 11's facts after fsdp_save.py (which asserts each part itself): every rank came
    through all the parts (a rank that stops early hands nothing back), with prefetch's timelines
    if it ran."""
    _expect(len(results) >= 1, 'no rank handed back a result')
    for rank, r in results.items():
        if 'prefetch' in args:
            _expect(set(r.get('prefetch', {})) == {'False', 'True'}, f'rank {rank}: no prefetch timelines handed back')


# What each script's notebook asserts after launching it (the scripts of notebooks 10 and 11
# also assert these themselves, and exit non-zero when one fails).
CHECKS = {
    'measure_zero.py': _check_measure_zero,
    'fsdp_save.py': _check_fsdp_save,
    'tp_sp.py': _check_tp_block,
    'tp_loss.py': _check_tp_dtensor,
    'tp_mfu.py': _check_tp_costs,
    'pp_schedules.py': _check_pp_schedules,
    'parallel_3d.py': _check_parallel_3d,
}
