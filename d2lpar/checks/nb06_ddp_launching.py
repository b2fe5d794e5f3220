"""Argument checks for the code notebook 06 teaches (d2lpar/lessons/nb06_ddp_launching.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

import os

from d2lpar.checks.nb05_ddp import _check_train


def _check_load_snapshot(path, net, optimizer, map_location):
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f'load_snapshot: path must be a file path, got {type(path).__name__}')
    _check_train(net)


CHECKS = {
    'load_snapshot': _check_load_snapshot,
}
