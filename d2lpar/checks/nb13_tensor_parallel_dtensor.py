"""Argument checks for the code notebook 13 teaches (d2lpar/lessons/nb13_tensor_parallel_dtensor.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

from d2lpar.checks import positive_int


def _check_block_bytes(num_params, tokens, dim, n, replicated=0, bytes_per_value=4):
    for name, value in (
        ('num_params', num_params),
        ('tokens', tokens),
        ('dim', dim),
        ('n', n),
        ('bytes_per_value', bytes_per_value),
    ):
        positive_int(value, f'block_bytes: {name}')
    if not isinstance(replicated, int) or isinstance(replicated, bool) or not 0 <= replicated <= num_params:
        raise ValueError(f'block_bytes: replicated must be an int from 0 to num_params, got {replicated!r}')


CHECKS = {
    'block_bytes': _check_block_bytes,
}
