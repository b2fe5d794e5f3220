"""Checker of notebook 1: choosing a GPU by index."""

import torch

from ._verdict import _call, _checker, _Fail


@_checker('pick_device(i, num_gpus)', 'pick_device')
def check_pick_device(pick_device, rng):
    """Check `pick_device(i, num_gpus)`: cuda:i if that GPU exists, else a ValueError that explains.

    Valid: `0 <= i < num_gpus` returns `torch.device('cuda', i)`. Anything else
    raises ValueError (TypeError is accepted for a non-int such as '1' or
    1.5) whose message names the index and how many GPUs there are.
    """
    machines = [0, 1, 2, 8, rng.randint(3, 16)]
    good = [(i, n) for n in machines if n for i in sorted({0, n - 1, rng.randrange(n)})]
    bad = [(i, n) for n in machines for i in sorted({n, n + rng.randint(1, 4), -1})]
    wrong_types = [(t, 2) for t in ('1', 1.0, None)]
    first = True
    for i, n in good:
        case = f'pick_device({i}, num_gpus={n})'
        got = _call(pick_device, (i, n), case, first)
        first = False
        if not isinstance(got, torch.device):
            raise _Fail(
                f'{case} returned {got!r} ({type(got).__name__}); return a torch.device, e.g. torch.device(\'cuda\', i)'
            )
        if got != torch.device('cuda', i):
            raise _Fail(
                f'{case} returned {got}, expected cuda:{i}. Hint: GPU i of this process '
                f'is cuda:{i}; do not fall back to the CPU when the GPU exists.'
            )
    for i, n in bad + wrong_types:
        case = f'pick_device({i!r}, num_gpus={n})'
        if not isinstance(i, int):
            hint = 'a GPU index must be an int; check isinstance(i, int).'
        elif i < 0:
            hint = "negative indices are not GPUs (Python's list[-1] does not apply to devices); require 0 <= i."
        elif i == n:
            valid = 'there is no valid index' if n == 0 else f'the indices are 0..{n - 1}'
            hint = f'with {n} GPUs {valid}: an off-by-one (i <= num_gpus)?'
        elif n == 0:
            hint = 'with num_gpus=0 there is no GPU at all, so every index is invalid.'
        else:
            hint = f'with {n} GPUs the valid indices are 0..{n - 1}.'
        try:
            got = pick_device(i, n)
        except NotImplementedError:
            raise _Fail(f'{case}: your code raised NotImplementedError; finish it.') from None
        except (ValueError, TypeError) as e:
            index = isinstance(i, int) and not isinstance(i, bool)
            if index and isinstance(e, TypeError):
                raise _Fail(
                    f'{case} raised TypeError, but {i} is an int: an index out of range is a ValueError.'
                ) from None
            message = str(e)
            # The count must appear besides the index itself ('GPU 1' alone, with 1 GPU, is
            # not 'there is 1 GPU').
            rest = message.replace(repr(i), '', 1)
            says_count = str(n) in rest or (n == 0 and 'no' in message.lower())
            if index and not (repr(i) in message and says_count):
                raise _Fail(
                    f'{case} raised {type(e).__name__}({message!r}). Hint: explain the '
                    f'problem: say which index was asked for ({i}) and how many GPUs '
                    f'there are ({n}), so the learner knows what to choose.'
                ) from None
            continue
        except Exception as e:
            raise _Fail(
                f'{case} raised {type(e).__name__}: {e}; check the index yourself and '
                'raise ValueError (TypeError for a non-int) with an explanation. '
                f'Hint: {hint}'
            ) from None
        if isinstance(got, torch.device) and got.type == 'cpu':
            hint = (
                'you fell back to the CPU, as d2lpar.try_gpu does; this exercise asks to '
                'refuse a missing GPU with an explanation, so a typo does not silently run '
                'everything on the CPU.'
            )
        raise _Fail(f'{case} returned {got!r} instead of raising ValueError. Hint: {hint}')
    return (
        f'{len(good)} valid and {len(bad) + len(wrong_types)} invalid requests (machines '
        f'with {", ".join(map(str, machines))} GPUs, negative and non-int indices) handled '
        'right, with explanations.'
    )
