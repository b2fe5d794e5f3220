"""Checker of notebook 18: the fastest layout that fits, by notebook 17's predictor."""

import itertools

from ..scale import predict
from ._verdict import _call, _checker, _Fail

_DIMS = ('pp', 'fsdp', 'tp')
_RULE = (
    'try every layout dict(pp=, fsdp=, tp=) whose degrees multiply to gpus, with pp dividing '
    "cfg['n_layers'] and fsdp dividing num_seqs; predict each with local_batch = num_seqs // fsdp "
    "(and microbatches = local_batch when pp > 1), ac='selective'; keep those whose predicted "
    "['peak'] is at most memory_limit and return the one with the smallest ['step_s']."
)
_SHAPES = [  # Llama-like models: (dim, n_layers, n_heads, n_kv_heads, hidden, vocab)
    (2048, 24, 16, 16, 5632, 32000),
    (4096, 32, 32, 32, 11008, 32000),
    (4096, 32, 32, 8, 14336, 128256),
    (5120, 40, 40, 40, 13824, 32000),
]


def predict_layout(cfg, gpus, num_seqs, seq_len, layout):
    """Return scale.predict's answer for `layout` (degrees pp, fsdp, tp) and a global batch of num_seqs."""
    local_batch = num_seqs // layout['fsdp']
    return predict(
        cfg,
        gpus,
        local_batch,
        seq_len,
        ac='selective',
        tp=layout['tp'],
        pp=layout['pp'],
        microbatches=local_batch if layout['pp'] > 1 else None,
    )


def _layouts(cfg, gpus, num_seqs):
    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    for degrees in itertools.product(divisors, repeat=3):
        layout = dict(zip(_DIMS, degrees))
        if (
            degrees[0] * degrees[1] * degrees[2] == gpus
            and cfg['n_layers'] % layout['pp'] == 0
            and num_seqs % layout['fsdp'] == 0
        ):
            yield layout


def _cases(rng):
    """Models, clusters and limits with one right layout, where ignoring memory or time goes wrong."""
    cases = []
    while len(cases) < 6:
        cfg = dict(zip(('dim', 'n_layers', 'n_heads', 'n_kv_heads', 'hidden', 'vocab'), rng.choice(_SHAPES)))
        gpus, num_seqs, seq_len = rng.choice([8, 16]), rng.choice([16, 32, 64]), rng.choice([2048, 4096, 8192])
        rows = [(predict_layout(cfg, gpus, num_seqs, seq_len, l), l) for l in _layouts(cfg, gpus, num_seqs)]
        peaks = sorted({p['peak'] for p, l in rows})
        limit = peaks[rng.randrange(len(peaks) // 2, len(peaks))]
        fit = sorted((p['step_s'], i) for i, (p, l) in enumerate(rows) if p['peak'] <= limit)
        fastest = min(range(len(rows)), key=lambda i: rows[i][0]['step_s'])
        least = min(range(len(rows)), key=lambda i: (rows[i][0]['peak'], rows[i][0]['step_s']))
        if len(fit) > 1 and fit[1][0] < fit[0][0] * (1 + 1e-6):
            continue  # a tie: two right answers
        if rows[fastest][0]['peak'] <= limit and least == fit[0][1] and rng.random() < 0.7:
            continue  # mostly cases where the memory limit and the time both decide
        cases.append((cfg, gpus, num_seqs, seq_len, limit, rows[fit[0][1]][1]))
    return cases


def _normal(layout):
    return {name: layout.get(name, 1) for name in _DIMS}


@_checker('choose_layout(cfg, gpus, num_seqs, seq_len, memory_limit)', 'choose_layout')
def check_choose_layout(choose_layout, rng):
    """Compare choose_layout with a search over all layouts under scale.predict."""
    for k, (cfg, gpus, num_seqs, seq_len, limit, best) in enumerate(_cases(rng)):
        case = f'choose_layout({cfg}, {gpus}, {num_seqs}, {seq_len}, {limit:.4g})'
        got = _call(choose_layout, (dict(cfg), gpus, num_seqs, seq_len, limit), case, first=k == 0, hint=_RULE)
        if not isinstance(got, dict) or set(got) - set(_DIMS):
            raise _Fail(f'{case}: return a dict of degrees with keys among {_DIMS}, got {got!r}.')
        got = _normal(got)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in got.values()):
            raise _Fail(f'{case}: the degrees must be positive ints, got {got}.')
        if got not in list(_layouts(cfg, gpus, num_seqs)):
            raise _Fail(
                f'{case}: {got} is no layout of {gpus} GPUs with whole stages and whole sequences '
                f'per FSDP rank.\nHint: {_RULE}'
            )
        mine, theirs = (predict_layout(cfg, gpus, num_seqs, seq_len, layout) for layout in (got, best))
        if mine['peak'] > limit:
            raise _Fail(
                f'{case}: {got} needs {mine["peak"]:.4g} bytes per GPU, more than the limit.'
                '\nHint: keep only layouts whose predicted peak fits.'
            )
        if mine['step_s'] > theirs['step_s']:
            raise _Fail(
                f'{case}: {got} fits but its step takes {mine["step_s"]:.3f} s; another layout '
                f'that fits takes {theirs["step_s"]:.3f} s.\nHint: {_RULE}'
            )
    return 'the fastest layout that fits, on every case.'
