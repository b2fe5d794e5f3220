"""Verdicts, and the wrapper that turns a checking body into a checker that never raises."""

import random

import torch

_LABELS = {'passed': 'passed', 'failed': 'not right yet', 'not attempted': 'not attempted yet'}


class Verdict:
    """The outcome of a checker: `.passed`, `.attempted`, `.status` and `.message`."""

    def __init__(self, exercise, status, message):
        if status not in _LABELS:
            raise ValueError(f'Verdict: status must be one of {sorted(_LABELS)}, got {status!r}')
        self.exercise, self.status, self.message = exercise, status, message

    @property
    def passed(self):
        return self.status == 'passed'

    @property
    def attempted(self):
        return self.status != 'not attempted'

    def __bool__(self):
        return self.passed

    def __str__(self):
        return f'{self.exercise}: {_LABELS[self.status]}\n{self.message}'

    __repr__ = __str__


class _Fail(Exception):
    """A wrong answer: the message says what is wrong and how to fix it."""


class _NotAttempted(Exception):
    """The learner's stub still raises NotImplementedError."""


def _checker(exercise, expects):
    """Turn `body(fn, rng)`, which raises _Fail on a wrong answer, into a checker."""

    def wrap(body):
        def check(fn, seed=None):
            if not callable(fn):
                return Verdict(
                    exercise,
                    'failed',
                    f'pass your {expects} itself to the checker, '
                    f'not a {type(fn).__name__} (e.g. check(my_function), '
                    f'not check(my_function()))',
                )
            if seed is None:
                seed = random.Random().randrange(2**31)  # a fresh instance: no global state used
            rng = random.Random(seed)
            try:
                # Nets built for the cases draw from torch's global generator: give it back
                # as it was, so checking an answer does not change the notebook's random numbers.
                with torch.random.fork_rng(devices=[]):
                    summary = body(fn, rng)
            except _NotAttempted:
                return Verdict(
                    exercise,
                    'not attempted',
                    f'your {expects} still raises NotImplementedError: fill it in and run this cell again.',
                )
            except _Fail as e:
                return Verdict(
                    exercise,
                    'failed',
                    f'{e}\n(These cases come from seed={seed}: pass seed={seed} to the checker to repeat them.)',
                )
            except Exception as e:  # an answer so odd that the comparison itself broke
                return Verdict(
                    exercise,
                    'failed',
                    f'the checker could not use what your {expects} gave back: {type(e).__name__}: {e}',
                )
            return Verdict(exercise, 'passed', summary)

        check.__name__ = check.__qualname__ = body.__name__
        check.__doc__, check.__module__ = body.__doc__, body.__module__
        return check

    return wrap


def _call(fn, args, case, first=False, kwargs=None, hint=None):
    """Call the learner's `fn`; an exception becomes _Fail (or _NotAttempted for a stub)."""
    try:
        return fn(*args, **(kwargs or {}))
    except NotImplementedError as e:
        if first:
            raise _NotAttempted() from None
        raise _Fail(f'{case}: your code raised NotImplementedError({e}); finish it.') from None
    except Exception as e:
        raise _Fail(f'{case}: your code raised {type(e).__name__}: {e}' + (f'\nHint: {hint}' if hint else '')) from None


def _shape(t):
    return tuple(t.shape)
