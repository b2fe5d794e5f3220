"""Checker of notebook 17: the largest local batch whose predicted peak memory fits a limit."""

from ..scale import LLAMA3, predict
from ._verdict import _Fail, _call, _checker

_RULE = (
    'increase the local batch from 1 while predict(cfg, gpus, batch, seq_len, ac=ac)["peak"] '
    'stays at most memory_limit; return the last batch that fitted (0 if batch 1 does not).'
)


def _largest(cfg, gpus, seq_len, ac, limit):
    batch = 0
    while predict(cfg, gpus, batch + 1, seq_len, ac=ac)['peak'] <= limit:
        batch += 1
    return batch


def _cases(rng):
    cases = []
    while len(cases) < 6:
        name = rng.choice(['8B', '70B'])
        gpus, seq_len = rng.choice([8, 16, 64, 128]), rng.choice([2048, 4096, 8192])
        ac = rng.choice(['full', 'selective'])
        one = predict(LLAMA3[name], gpus, 1, seq_len, ac=ac)['peak']
        limit = one * rng.choice([0.9, 1.0, 1.5, 3.2, 7.7])  # at, below and above one batch
        cases.append((name, gpus, seq_len, ac, limit, _largest(LLAMA3[name], gpus, seq_len, ac, limit)))
    return cases


@_checker('largest_batch(cfg, gpus, seq_len, ac, memory_limit)', 'largest_batch')
def check_largest_batch(largest_batch, rng):
    """Compare largest_batch with a search over batches under scale.predict."""
    for k, (name, gpus, seq_len, ac, limit, best) in enumerate(_cases(rng)):
        case = f"largest_batch(LLAMA3['{name}'], {gpus}, {seq_len}, '{ac}', {limit:.6g})"
        got = _call(largest_batch, (LLAMA3[name], gpus, seq_len, ac, limit), case, first=k == 0, hint=_RULE)
        if not isinstance(got, int) or isinstance(got, bool) or got < 0:
            raise _Fail(f'{case}: return a non-negative int, got {got!r}.')
        if got > best:
            peak = predict(LLAMA3[name], gpus, got, seq_len, ac=ac)['peak']
            raise _Fail(f'{case}: batch {got} needs {peak:.4g} bytes per GPU, more than the limit.\nHint: {_RULE}')
        if got < best:
            raise _Fail(f'{case}: batch {best} also fits, and it is larger than {got}.\nHint: {_RULE}')
    return 'the largest batch that fits, on every case.'
