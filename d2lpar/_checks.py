"""Argument checks shared by the modules, so every caller words an error the same way."""


def positive_int(value, name, hint=''):
    """Return `value` if it is a positive int (a bool is not), else raise a ValueError naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f'{name} must be a positive int, got {value!r}{hint}')
    return value
