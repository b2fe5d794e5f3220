"""Argument checks for the code notebook 18 teaches (d2lpar/lessons/nb18_capstone.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

import math

from d2lpar.checks import positive_int, process_group_size


def _check_degrees(caller, layout):
    from d2lpar.lessons.nb18_capstone import DIMS  # the lesson imports this module

    if not isinstance(layout, dict):
        raise TypeError(
            f'{caller}: layout must be a dict of degrees such as dict(dp=2, tp=2), got {type(layout).__name__}'
        )
    unknown = sorted(set(layout) - set(DIMS))
    if unknown:
        raise ValueError(
            f'{caller}: unknown dimension(s) {unknown}; a layout names degrees of '
            f'{", ".join(DIMS)} (expert parallelism is not built here: this GPT has no experts)'
        )
    for name, degree in layout.items():
        positive_int(degree, f'{caller}: the degree of {name!r}')


def _check_layout_mesh(layout):
    _check_degrees('layout_mesh', layout)
    world_size = process_group_size('layout_mesh')
    product = math.prod(layout.values())
    if product != world_size:
        raise ValueError(
            f'layout_mesh: the degrees of {layout} multiply to {product}, but there are '
            f'{world_size} processes; choose degrees whose product is {world_size}'
        )
    if world_size == 1:
        raise ValueError('layout_mesh: one process needs no mesh; run the model as it is')


def _check_layout_cost(layout, num_params, tokens, dim, num_layers, bytes_per_value=4):
    _check_degrees('layout_cost', layout)
    for name, value in (
        ('num_params', num_params),
        ('tokens', tokens),
        ('dim', dim),
        ('num_layers', num_layers),
        ('bytes_per_value', bytes_per_value),
    ):
        positive_int(value, f'layout_cost: {name}')


CHECKS = {
    'layout_mesh': _check_layout_mesh,
    'layout_cost': _check_layout_cost,
}
