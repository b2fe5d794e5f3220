"""Checker of notebook 8: a ring allreduce and split_batch."""

import math

import torch
from torch.overrides import TorchFunctionMode

from ..checks.nb08_lenet_data_parallel import _memory
from ..devices import device_slots
from ._verdict import _call, _checker, _Fail


def _slot_tensors(rng, generator, k, shape, dtype):
    slots = device_slots(k, verbose=False)
    if dtype.is_floating_point:
        values = [torch.randn(shape, generator=generator, dtype=dtype) for _ in range(k)]
    else:
        values = [torch.randint(-50, 50, shape, generator=generator, dtype=dtype) for _ in range(k)]
    return [v.to(d) for v, d in zip(values, slots)]


class _WriteRecorder(TorchFunctionMode):
    """Record how many elements each in-place write into the given tensors' memory covers."""

    def __init__(self, tensors):
        super().__init__()
        self.storages = {_memory(t) for t in tensors if t.numel()}
        self.sizes = []

    def __enter__(self):
        super().__enter__()
        return self.sizes

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        target = args[0] if args else None
        if isinstance(target, torch.Tensor) and target.numel() and _memory(target) in self.storages:
            name = getattr(func, '__name__', '')
            if name == '__setitem__':
                self.sizes.append(target[args[1]].numel())
            elif name.startswith('__i') or (name.endswith('_') and not name.startswith('_')):
                self.sizes.append(target.numel())  # add_, copy_, +=, ...
        return result


@_checker('ring_allreduce(data)', 'ring_allreduce')
def check_ring_allreduce(ring_allreduce, rng):
    """Check `ring_allreduce(data)`: every tensor of `data` must end up holding the sum, in place.

    `data` holds one tensor per device slot. The reference is the sum of the
    inputs, computed in float64. The checker verifies the result (values,
    in place, on the same device, no shared memory) and that it was built as a
    ring: no single in-place write into a slot's tensor covers more than one
    chunk (ceil(numel / k) elements), which rules out the naive allreduce.
    """
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    cases = [
        (2, (6,), torch.float32),
        (3, (2,), torch.float32),
        (1, (5,), torch.float32),
        (4, (0,), torch.float32),
        (3, (7,), torch.int64),
        (4, (3, 5), torch.float32),
    ]
    cases += [(rng.randint(2, 6), (rng.randint(1, 40),), torch.float32) for _ in range(4)]
    for n, (k, shape, dtype) in enumerate(cases):
        data = _slot_tensors(rng, generator, k, shape, dtype)
        originals = list(data)
        inputs = [t.detach().cpu().clone() for t in data]
        expected = torch.stack([t.double() for t in inputs]).sum(0)
        case = f'{k} tensor(s) of shape {shape} and dtype {dtype}'
        with _WriteRecorder(data) as writes:
            _call(ring_allreduce, (data,), f'ring_allreduce on {case}', first=n == 0)
        if len(data) != k:
            raise _Fail(f'{case}: data now holds {len(data)} tensors; keep one per slot.')
        if len({_memory(t) for t in data if t.numel()}) < sum(1 for t in data if t.numel()):
            raise _Fail(
                f'{case}: after your allreduce some entries of data share memory (the '
                'same tensor on several slots). Hint: the replicas alias: the next '
                'update of one changes all, and each slot no longer has its own copy. '
                'Write the total into each slot\'s own tensor with .copy_(...).'
            )
        for i, (t, original) in enumerate(zip(data, originals)):
            if t is not original:
                raise _Fail(
                    f'{case}: data[{i}] is a new tensor, so the tensor the caller holds '
                    '(e.g. a parameter\'s .grad) did not change. Hint: `x = ...` or '
                    '`data[i] = ...` rebinds a name; write into the tensor instead: '
                    'data[i].copy_(...), data[i] += ..., or a chunk view\'s += / copy_.'
                )
            if t.device != original.device or t.dtype != inputs[i].dtype:
                raise _Fail(
                    f'{case}: data[{i}] is now on {t.device} with dtype {t.dtype}; keep '
                    f'it on {original.device} with dtype {inputs[i].dtype}.'
                )
        for i, t in enumerate(data):
            got = t.detach().cpu().double()
            if torch.allclose(got, expected, rtol=1e-5, atol=1e-5):
                continue
            wrong = ~torch.isclose(got, expected, rtol=1e-5, atol=1e-5)
            single = torch.zeros_like(wrong)
            for x in inputs:
                single |= torch.isclose(got, x.double(), rtol=1e-5, atol=1e-5)
            if torch.equal(got, inputs[i].double()) and k > 1:
                hint = (
                    f'data[{i}] is unchanged: nothing was written into it. Did you assign '
                    'a result to a local name (`chunk = ...`) instead of updating the '
                    'tensor (`chunk += ...`, `chunk.copy_(...)`)?'
                )
            elif bool(single[wrong].all()):
                hint = (
                    'the wrong values are single slots\' values, not sums: a received '
                    'chunk was assigned where it should be added. In the reduce-scatter '
                    'steps add it in place (+=); only the all-gather steps copy.'
                )
            elif torch.allclose(got, expected / k, rtol=1e-5, atol=1e-5):
                hint = 'that is the mean; an allreduce here sums (divide later, in the update).'
            elif torch.allclose(got, 2 * expected, rtol=1e-5, atol=1e-5):
                hint = 'every value is counted twice: did you add a slot\'s own chunk to itself?'
            else:
                wrong = wrong.flatten()
                hint = (
                    f'{int(wrong.sum())} of {wrong.numel()} values are off (first at flat '
                    f'index {int(wrong.nonzero()[0])}). With n slots there are n - 1 '
                    'reduce-scatter steps (add) and n - 1 all-gather steps (copy); check '
                    'which chunk each slot sends at each step.'
                )
            raise _Fail(f'{case}: data[{i}] is not the sum of the inputs. Hint: {hint}')
        numel, chunk = inputs[0].numel(), math.ceil(inputs[0].numel() / k)
        if k > 1 and numel >= k and max(writes, default=0) > chunk:
            raise _Fail(
                f'{case}: the sums are right, but not computed by a ring: one write into '
                f'a slot\'s tensor covered {max(writes)} elements, more than a chunk '
                f'({chunk} = ceil({numel} / {k})). Hint: that is the naive allreduce '
                '(everything through one place, then copied back). Cut each tensor '
                'into k chunks (t.view(-1).tensor_split(k)) and, at every step, let '
                'each slot pass one chunk to its neighbour: add it during the k - 1 '
                'reduce-scatter steps, copy it during the k - 1 all-gather steps.'
            )
    return (
        f'{len(cases)} allreduces (1 to 6 slots; float and int; empty tensors and tensors '
        'with fewer elements than slots) leave the exact sum in every slot\'s own tensor, '
        'written one chunk at a time as a ring does.'
    )


def _place_label(device):
    return (
        'meta (a device without data the checker uses to see placement)'
        if torch.device(device).type == 'meta'
        else str(device)
    )


@_checker('split_batch(X, y, devices)', 'split_batch')
def check_split_batch(split_batch, rng):
    """Check `split_batch(X, y, devices)` for batches whose size does not divide by the devices.

    Part k goes to devices[k]; the parts keep every row in order, their sizes
    differ by at most one (the larger ones first, as torch.tensor_split makes
    them), and X and y are split alike. Fewer rows than devices is a ValueError.
    """
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    cases = [(10, 4), (5, 4), (8, 4), (7, 3), (3, 3), (9, 1)]
    cases += [(rng.randint(k, 50), k) for k in (rng.randint(2, 8) for _ in range(4))]
    for idx, (rows, k) in enumerate(cases):
        X = torch.randn((rows, 2, 3), generator=generator)
        y = torch.randint(0, 10, (rows,), generator=generator)
        devices = device_slots(k, verbose=False)
        case = f'split_batch of {rows} rows across {k} devices'
        got = _call(split_batch, (X.clone(), y.clone(), devices), case, first=idx == 0)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise _Fail(f'{case} returned {type(got).__name__}; return (X_parts, y_parts).')
        X_parts, y_parts = (list(p) for p in got)
        expected = torch.tensor_split(torch.arange(rows), k)
        sizes = [p.shape[0] for p in X_parts]
        if len(X_parts) != k or len(y_parts) != k:
            hint = (
                ' torch.chunk makes parts of ceil(n/k) rows and can run out of rows before the devices run out.'
                if len(X_parts) < k
                else ''
            )
            raise _Fail(
                f'{case}: got {len(X_parts)} X parts and {len(y_parts)} y parts; each '
                f'of the {k} devices needs one.{hint}'
            )
        if sum(sizes) != rows:
            raise _Fail(
                f'{case}: the parts hold {sum(sizes)} of {rows} rows (sizes {sizes}). '
                f'Hint: {rows} % {k} = {rows % k} rows are left over when every part '
                'gets n // k; give one extra row to each of the first n % k parts '
                'instead of dropping them.'
            )
        if max(sizes) - min(sizes) > 1 or sizes != [len(e) for e in expected]:
            raise _Fail(
                f'{case}: part sizes {sizes}, expected {[len(e) for e in expected]}. '
                'Hint: sizes may differ by at most one, the larger parts first, as '
                'torch.tensor_split makes them (torch.chunk does not balance them).'
            )
        for j, (xp, yp, d) in enumerate(zip(X_parts, y_parts, devices)):
            if xp.device != d or yp.device != d:
                raise _Fail(f'{case}: part {j} is on {xp.device}/{yp.device}, not on devices[{j}] = {d}.')
            if not (torch.equal(xp.cpu(), X[expected[j]]) and torch.equal(yp.cpu(), y[expected[j]])):
                raise _Fail(
                    f'{case}: part {j} does not hold rows {expected[j].tolist()} of X and '
                    'y. Hint: keep the rows in order, and split X and y at the same '
                    'places so each example keeps its label.'
                )
    devices = [torch.device('cpu'), torch.device('meta')]
    case = 'split_batch of 5 rows across [cpu, meta]'
    got = _call(split_batch, (torch.randn(5, 3), torch.arange(5), devices), case)
    for j, d in enumerate(devices):
        for what, part in (('X', got[0][j]), ('y', got[1][j])):
            if part.device != d:
                raise _Fail(
                    f'{case}: {what} part {j} is on {part.device}, not on '
                    f'{_place_label(d)}. Hint: move each part with .to(devices[k]).'
                )
    for rows, k in [(3, 4), (0, 2)]:
        case = f'split_batch of {rows} rows across {k} devices'
        try:
            split_batch(torch.randn(rows, 2), torch.arange(rows), device_slots(k, verbose=False))
        except NotImplementedError:
            raise _Fail(f'{case}: your code raised NotImplementedError; finish it.') from None
        except ValueError:
            continue
        except Exception as e:
            raise _Fail(
                f'{case} raised {type(e).__name__}: {e}; a batch too small for the '
                'devices should raise ValueError saying so.'
            ) from None
        raise _Fail(
            f'{case} did not raise: a device would get no rows. Hint: raise ValueError '
            'when there are fewer rows than devices, so the experiment does not '
            'silently change.'
        )
    return (
        f'{len(cases)} batches (sizes that divide and sizes that do not) are split into '
        'balanced parts on the right devices with no row lost; too-small batches are refused.'
    )
