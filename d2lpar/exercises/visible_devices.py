"""Checker of notebook 2: what a CUDA_VISIBLE_DEVICES mask shows."""

from ..visibility import visible_gpus
from ._verdict import _call, _checker, _Fail


def _random_masks(rng, n):
    """Return (mask, num_gpus, kind) cases, the edge cases first."""
    cases = [
        (None, n, 'unset'),
        ('', n, 'empty'),
        ('-1', n, 'minus one'),
        ('0', n, 'plain'),
        ('1,0', max(n, 2), 'plain'),
        ('0,0', n, 'repeat'),
        ('0,2,-1,1', max(n, 4), 'invalid'),
        ('0,5', 4, 'range'),
        ('0,5', 8, 'plain'),
        ('abc', n, 'invalid'),
        (str(n), n, 'range'),
        ('0, 1', max(n, 2), 'strtoul'),
        (' 1', max(n, 2), 'strtoul'),
        ('1gpu,0', max(n, 2), 'strtoul'),
    ]
    for _ in range(8):
        m = rng.randint(1, 8)
        entries = rng.sample(range(m), rng.randint(1, m))
        kind = 'plain'
        roll = rng.random()
        if roll < 0.25:
            entries.insert(rng.randrange(len(entries) + 1), -1)
            kind = 'invalid'
        elif roll < 0.5:
            entries.append(m + rng.randint(0, 3))
            rng.shuffle(entries)
            kind = 'range'
        elif roll < 0.65:
            entries.append(rng.choice(entries))
            kind = 'repeat'
        cases.append((','.join(map(str, entries)), m, kind))
    return cases


_MASK_HINTS = {
    'unset': 'an unset CUDA_VISIBLE_DEVICES hides nothing: every GPU is visible.',
    'empty': 'an empty mask hides every GPU.',
    'minus one': "'-1' is not a GPU: parsing stops there, so nothing is visible.",
    'repeat': 'a GPU listed twice makes the whole mask invalid: no GPU is visible.',
    'invalid': ('parsing stops at the first entry that is not a GPU number; the entries before it still count.'),
    'range': (
        'a GPU number the machine does not have stops the list like an invalid '
        'entry; the entries before it still count.'
    ),
    'plain': 'count the GPU numbers in the mask; the order does not change the count.',
    'strtoul': (
        "each entry is read like C's strtoul: leading spaces are skipped and the "
        "number ends at the first non-digit, so ' 1' and '1gpu' both mean GPU 1."
    ),
}


@_checker('predict_device_count(mask, num_gpus)', 'predict_device_count')
def check_visible_count(predict_device_count, rng):
    """Check `predict_device_count(mask, num_gpus)` against d2lpar.visible_gpus.

    `mask` is a CUDA_VISIBLE_DEVICES value (None when unset) and `num_gpus`
    the GPUs the machine has; the answer is what torch.cuda.device_count()
    reports in a process started with that mask.
    """
    cases = _random_masks(rng, rng.randint(2, 8))
    for k, (mask, n, kind) in enumerate(cases):
        case = f'predict_device_count({mask!r}, num_gpus={n})'
        got = _call(predict_device_count, (mask, n), case, first=k == 0)
        expected = len(visible_gpus(mask, n))
        if isinstance(got, bool) or not isinstance(got, int):
            raise _Fail(f'{case} returned {got!r}; return an int, the number of GPUs visible.')
        if got != expected:
            raise _Fail(
                f'{case} returned {got}, but a process started with that mask on a '
                f'{n}-GPU machine sees {expected}. Hint: {_MASK_HINTS[kind]}'
            )
    kinds = sorted({kind for _, _, kind in cases})
    return f'{len(cases)} masks predicted right, including the cases: {", ".join(kinds)}.'
