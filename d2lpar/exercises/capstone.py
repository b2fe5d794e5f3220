"""Checker of notebook 17: choose the layout that fits a memory limit with the fewest bytes sent."""
import itertools

from ..capstone import layout_cost
from ._verdict import _call, _checker, _Fail

_DIMS = ('pp', 'dp', 'fsdp', 'tp')
_RULE = ('try every layout whose degrees multiply to world_size (pp dividing num_layers), keep '
         'those whose held bytes (layout_cost(...)[1]) are at most memory_limit, and return the '
         'one whose sent bytes (layout_cost(...)[0]) are smallest.')


def _layouts(world_size, num_layers):
    divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
    for degrees in itertools.product(divisors, repeat=4):
        layout = dict(zip(_DIMS, degrees))
        if degrees[0] * degrees[1] * degrees[2] * degrees[3] == world_size and num_layers % layout['pp'] == 0:
            yield layout


def _normal(layout):
    return {name: layout.get(name, 1) for name in _DIMS}


def _cases(rng):
    """Models and limits with one right layout, where ignoring memory or bytes goes wrong."""
    cases = []
    while len(cases) < 6:
        world_size = rng.choice([2, 4, 8])
        model = dict(num_params=rng.choice([10**8, 10**9, 7 * 10**9, 3 * 10**10]),
                     tokens=rng.choice([8, 16, 64]) * 2048, dim=rng.choice([1024, 4096, 8192]),
                     num_layers=rng.choice([8, 24, 32]))
        costs = [(layout_cost(l, **model), l) for l in _layouts(world_size, model['num_layers'])]
        helds = sorted({held for (sent, held), l in costs})
        limit = helds[rng.randrange(len(helds))] * rng.choice([1.0, 1.05])
        fit = sorted((sent, i) for i, ((sent, held), l) in enumerate(costs) if held <= limit)
        if len(fit) > 1 and fit[0][0] == fit[1][0]:
            continue  # a tie: two right answers
        fewest_bytes = min(range(len(costs)), key=lambda i: costs[i][0][0])
        least_memory = min(range(len(costs)), key=lambda i: (costs[i][0][1], costs[i][0][0]))
        if costs[fewest_bytes][0][1] <= limit or least_memory == fit[0][1]:
            continue  # a case where the memory limit and the bytes both decide
        cases.append((world_size, model, limit, costs, costs[fit[0][1]][1]))
    return cases


@_checker('choose_layout(world_size, num_params, tokens, dim, num_layers, memory_limit)', 'choose_layout')
def check_choose_layout(choose_layout, rng):
    """Compare choose_layout with a search over all layouts under layout_cost."""
    for k, (world_size, model, limit, costs, best) in enumerate(_cases(rng)):
        case = (f'choose_layout({world_size}, {model["num_params"]}, {model["tokens"]}, '
                f'{model["dim"]}, {model["num_layers"]}, {limit:.4g})')
        got = _call(choose_layout, (world_size, *model.values(), limit), case, first=k == 0, hint=_RULE)
        if not isinstance(got, dict) or set(got) - set(_DIMS):
            raise _Fail(f'{case}: return a dict of degrees with keys among {_DIMS}, got {got!r}.')
        got = _normal(got)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in got.values()):
            raise _Fail(f'{case}: the degrees must be positive ints, got {got}.')
        product = got['pp'] * got['dp'] * got['fsdp'] * got['tp']
        if product != world_size:
            raise _Fail(f'{case}: the degrees of {got} multiply to {product}, not to the '
                        f'{world_size} processes.')
        if model['num_layers'] % got['pp']:
            raise _Fail(f'{case}: pp={got["pp"]} does not divide the {model["num_layers"]} layers '
                        'into whole stages.')
        sent, held = layout_cost(got, **model)
        if held > limit:
            raise _Fail(f'{case}: {got} holds {held:.4g} bytes per rank, more than the limit '
                        f'{limit:.4g}.\nHint: keep only layouts whose held bytes fit.')
        best_sent = layout_cost(best, **model)[0]
        if sent > best_sent:
            raise _Fail(f'{case}: {got} fits but sends {sent:.4g} bytes per rank; another layout '
                        f'that fits sends {best_sent:.4g}.\nHint: {_RULE}')
    return 'the layout that fits with the fewest bytes, on every case.'
