"""Checker of notebook 13: model FLOPs utilization, counted right."""

import math

from ._verdict import _call, _checker, _Fail


def _reference(tokens, seconds, num_params, layers, seq_len, dim, n, peak):
    """Tokens of the whole step per second, times the model's FLOPs per token, over all devices' peak."""
    return tokens / seconds * (6 * num_params + 12 * layers * seq_len * dim) / (n * peak)


def _hint(got, tokens, seconds, num_params, layers, seq_len, dim, n, peak):
    want = _reference(tokens, seconds, num_params, layers, seq_len, dim, n, peak)
    mistakes = [
        (want * n, "it is n times too high: divide by the peak of all n devices, not one device's"),
        (want / n, 'it is n times too low: count the tokens of the whole step once, not the tokens per device'),
        (
            tokens / seconds * 6 * num_params / (n * peak),
            "the attention's FLOPs are missing: 12 * layers * seq_len * dim per token, besides 6 * num_params",
        ),
        (want / 3, 'only forward counted: backward does twice forward\'s matmuls (6 = 2 forward + 4 backward)'),
        (
            tokens / seconds * (6 * num_params + 6 * layers * seq_len * dim) / (n * peak),
            "the attention's FLOPs are half counted: q k^T and the weighted sum of v are 2 * seq_len * dim "
            'each forward, 12 * seq_len * dim forward and backward',
        ),
    ]
    for value, text in mistakes:
        if math.isclose(got, value, rel_tol=1e-9):
            return text
    return 'MFU = tokens per second (the whole step) * (6 num_params + 12 layers seq_len dim) / (n * peak)'


@_checker('mfu(tokens, seconds, num_params, layers, seq_len, dim, n, peak)', 'mfu')
def check_mfu(mfu, rng):
    """Check `mfu`: the model FLOPs utilization of a training step on n devices.

    `mfu(tokens, seconds, num_params, layers, seq_len, dim, n, peak)` gets the tokens of one
    step (all devices together), the step's seconds, the model's parameters, its layers,
    sequence length and width, the number of devices and one device's peak FLOP/s. The
    reference counts 6 num_params + 12 layers seq_len dim FLOPs per token, forward and
    backward, over n devices' peak.
    """
    cases = [(65536, 1.0, 12 * 4096**2 * 32, 32, 4096, 4096, 8, 989e12)]
    for _ in range(5):
        layers, dim = rng.randint(1, 48), 64 * rng.randint(1, 64)
        cases.append(
            (
                rng.choice([1024, 4096, 32768]) * rng.randint(1, 8),
                rng.uniform(0.05, 5),
                12 * dim * dim * layers,
                layers,
                rng.choice([512, 1024, 2048, 8192]),
                dim,
                rng.choice([2, 4, 8, 64]),
                rng.choice([312e12, 989e12, 2.25e15]),
            )
        )
    for k, args in enumerate(cases):
        case = 'mfu(tokens={}, seconds={:.3f}, num_params={}, layers={}, seq_len={}, dim={}, n={}, peak={:.3g})'.format(
            *args
        )
        got = _call(mfu, args, case, first=k == 0)
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
            raise _Fail(f'{case}: return the utilization as a number (a fraction such as 0.4), got {got!r}.')
        want = _reference(*args)
        if not math.isclose(got, want, rel_tol=1e-6):
            if math.isclose(got, 100 * want, rel_tol=1e-6):
                raise _Fail(f'{case}: {got:.4g} is a percentage. Hint: return a fraction (0.4, not 40).')
            raise _Fail(f'{case}: your MFU is {got:.4g}, the right one {want:.4g}. Hint: {_hint(got, *args)}.')
    return (
        f'all {len(cases)} cases: the whole step\'s tokens, 6 num_params + 12 layers seq_len dim '
        'FLOPs each, over n devices\' peak.'
    )
