"""Checkers for the notebooks' "implement this" exercises.

Each `check_xxx(fn)` runs the learner's function on several randomized cases
(edge cases included), compares it with a reference (PyTorch itself, a
tested d2lpar primitive, or a hand calculation) and returns a `Verdict`. A
checker never raises because of the answer: a wrong result, a function that
raises, and a stub that still raises NotImplementedError (reported as "not
attempted yet") all become verdicts with a message and a hint.
"""
import math
import random

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .devices import device_slots
from .parallel import _memory
from .visibility import visible_gpus

__all__ = ['Verdict', 'check_pick_device', 'check_visible_count', 'check_load_checkpoint',
           'check_unbalanced_bubble', 'check_sampler', 'check_ring_allreduce',
           'check_split_batch', 'check_broadcast_schedule']

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
                return Verdict(exercise, 'failed', f'pass your {expects} itself to the checker, '
                               f'not a {type(fn).__name__} (e.g. check(my_function), '
                               f'not check(my_function()))')
            if seed is None:
                seed = random.Random().randrange(2**31)  # a fresh instance: no global state used
            rng = random.Random(seed)
            try:
                # Nets built for the cases draw from torch's global generator: give it back
                # as it was, so checking an answer does not change the notebook's random numbers.
                with torch.random.fork_rng(devices=[]):
                    summary = body(fn, rng)
            except _NotAttempted:
                return Verdict(exercise, 'not attempted',
                               f'your {expects} still raises NotImplementedError: fill it in '
                               'and run this cell again.')
            except _Fail as e:
                return Verdict(exercise, 'failed',
                               f'{e}\n(These cases come from seed={seed}: pass seed={seed} to '
                               'the checker to repeat them.)')
            except Exception as e:  # an answer so odd that the comparison itself broke
                return Verdict(exercise, 'failed', f'the checker could not use what your '
                               f'{expects} gave back: {type(e).__name__}: {e}')
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
        raise _Fail(f'{case}: your code raised {type(e).__name__}: {e}'
                    + (f'\nHint: {hint}' if hint else '')) from None


def _shape(t):
    return tuple(t.shape)


# ---------------------------------------------------------------- notebook 1

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
            raise _Fail(f'{case} returned {got!r} ({type(got).__name__}); return a torch.device, '
                        f"e.g. torch.device('cuda', i)")
        if got != torch.device('cuda', i):
            raise _Fail(f'{case} returned {got}, expected cuda:{i}. Hint: GPU i of this process '
                        f'is cuda:{i}; do not fall back to the CPU when the GPU exists.')
    for i, n in bad + wrong_types:
        case = f'pick_device({i!r}, num_gpus={n})'
        if not isinstance(i, int):
            hint = 'a GPU index must be an int; check isinstance(i, int).'
        elif i < 0:
            hint = ("negative indices are not GPUs (Python's list[-1] does not apply to "
                    'devices); require 0 <= i.')
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
                raise _Fail(f'{case} raised TypeError, but {i} is an int: an index out of range '
                            'is a ValueError.') from None
            message = str(e)
            # The count must appear besides the index itself ('GPU 1' alone, with 1 GPU, is
            # not 'there is 1 GPU').
            rest = message.replace(repr(i), '', 1)
            says_count = str(n) in rest or (n == 0 and 'no' in message.lower())
            if index and not (repr(i) in message and says_count):
                raise _Fail(f'{case} raised {type(e).__name__}({message!r}). Hint: explain the '
                            f'problem: say which index was asked for ({i}) and how many GPUs '
                            f'there are ({n}), so the learner knows what to choose.') from None
            continue
        except Exception as e:
            raise _Fail(f'{case} raised {type(e).__name__}: {e}; check the index yourself and '
                        'raise ValueError (TypeError for a non-int) with an explanation. '
                        f'Hint: {hint}') from None
        if isinstance(got, torch.device) and got.type == 'cpu':
            hint = ('you fell back to the CPU, as d2lpar.try_gpu does; this exercise asks to '
                    'refuse a missing GPU with an explanation, so a typo does not silently run '
                    'everything on the CPU.')
        raise _Fail(f'{case} returned {got!r} instead of raising ValueError. Hint: {hint}')
    return (f'{len(good)} valid and {len(bad) + len(wrong_types)} invalid requests (machines '
            f'with {", ".join(map(str, machines))} GPUs, negative and non-int indices) handled '
            'right, with explanations.')


# ---------------------------------------------------------------- notebook 2

def _random_masks(rng, n):
    """Return (mask, num_gpus, kind) cases, the edge cases first."""
    cases = [(None, n, 'unset'), ('', n, 'empty'), ('-1', n, 'minus one'),
             ('0', n, 'plain'), ('1,0', max(n, 2), 'plain'), ('0,0', n, 'repeat'),
             ('0,2,-1,1', max(n, 4), 'invalid'), ('0,5', 4, 'range'), ('0,5', 8, 'plain'),
             ('abc', n, 'invalid'), (str(n), n, 'range'), ('0, 1', max(n, 2), 'strtoul'),
             (' 1', max(n, 2), 'strtoul'), ('1gpu,0', max(n, 2), 'strtoul')]
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
    'invalid': ('parsing stops at the first entry that is not a GPU number; the entries '
                'before it still count.'),
    'range': ('a GPU number the machine does not have stops the list like an invalid '
              'entry; the entries before it still count.'),
    'plain': 'count the GPU numbers in the mask; the order does not change the count.',
    'strtoul': ("each entry is read like C's strtoul: leading spaces are skipped and the "
                "number ends at the first non-digit, so ' 1' and '1gpu' both mean GPU 1."),
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
            raise _Fail(f'{case} returned {got}, but a process started with that mask on a '
                        f'{n}-GPU machine sees {expected}. Hint: {_MASK_HINTS[kind]}')
    kinds = sorted({kind for _, _, kind in cases})
    return (f'{len(cases)} masks predicted right, including the cases: {", ".join(kinds)}.')


# ---------------------------------------------------------------- notebook 3

class _Block(nn.Module):
    """A net whose keys hold 'module.' mid-name (`submodule`) and start with its letters (`decoder`)."""

    def __init__(self, hidden):
        super().__init__()
        self.submodule = nn.Linear(4, hidden)
        self.norm = nn.BatchNorm1d(hidden)
        self.decoder = nn.Linear(hidden, 3)

    def forward(self, X):
        return self.decoder(torch.relu(self.norm(self.submodule(X))))


def _nets(rng):
    """Return (name, factory) pairs: fresh nets of the same architecture from each factory."""
    hidden = rng.randint(3, 9)
    return [('nn.Sequential(Linear, BatchNorm1d, ReLU, Linear)',
             lambda h=hidden: nn.Sequential(nn.Linear(5, h), nn.BatchNorm1d(h), nn.ReLU(),
                                            nn.Linear(h, 2))),
            ('a net with a layer named `submodule`', lambda h=hidden: _Block(h))]


def _trained_state(make, generator):
    """Return a state_dict of a net built by `make` with random weights and buffers."""
    net = make()
    with torch.no_grad():
        for t in net.state_dict().values():
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=generator))
            elif t.numel():
                t.fill_(int(torch.randint(1, 100, (), generator=generator)))
    return net


def _load_into_fresh(load, make, checkpoint, case, first, hint):
    net = make()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    _call(load, (net, checkpoint), case, first, hint=hint)
    return net, before


@_checker('load_checkpoint(net, state_dict)', 'load_checkpoint')
def check_load_checkpoint(load_checkpoint, rng):
    """Check `load_checkpoint(net, state_dict)` on checkpoints of nn.DataParallel and of plain nets.

    A checkpoint saved from nn.DataParallel (or DDP) has keys 'module.xxx';
    it must load into the plain `net`, as must a plain checkpoint. One that
    does not fit the net (a key missing, one too many, a wrong shape) must
    raise an error instead of loading silently.
    """
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    first = True
    for name, make in _nets(rng):
        source = _trained_state(make, generator)
        reference = {k: v.clone() for k, v in source.state_dict().items()}
        wrapped = nn.DataParallel(source).state_dict()  # keys 'module.xxx', PyTorch's own
        for kind, checkpoint in [('nn.DataParallel', wrapped), ('plain', reference)]:
            case = f'{"an" if kind[0] == "n" else "a"} {kind} checkpoint of {name}'
            hint = ('this checkpoint fits the net, so it must load. If the error lists keys '
                    "such as 'subweight', .replace('module.', '') also cut 'module.' out of the "
                    "middle of a name ('submodule.weight'); if it lists 'coder.weight', "
                    ".lstrip('module.') removed every leading m, o, d, u, l, e and '.' (it takes "
                    "a set of characters, not a prefix). Strip only a leading 'module.'."
                    if kind == 'nn.DataParallel' else
                    "a checkpoint saved from the plain net has no 'module.' prefix: strip the "
                    'prefix only when the keys have it, and load a plain checkpoint as it is.')
            net, before = _load_into_fresh(load_checkpoint, make, dict(checkpoint), case, first,
                                           hint)
            first = False
            after = net.state_dict()
            if set(after) != set(reference):
                raise _Fail(f'{case}: the net now has the keys {sorted(after)}, expected '
                            f'{sorted(reference)}. Load into the net you are given; do not '
                            'wrap it or rename its layers.')
            unchanged = [k for k in reference if torch.equal(after[k].cpu(), before[k].cpu())
                         and not torch.equal(before[k].cpu(), reference[k].cpu())]
            wrong = [k for k in reference if not torch.equal(after[k].cpu(), reference[k].cpu())]
            if unchanged and len(unchanged) == len(wrong):
                hint = (("its keys start with 'module.' (the wrapper's attribute), the net's do "
                         "not: strip that leading prefix. With strict=False, load_state_dict "
                         "skips every key that does not match without a word, which is why "
                         "nothing told you.") if kind == 'nn.DataParallel' else
                        'a plain checkpoint has no prefix to strip: load its keys as they are.')
                raise _Fail(f'{case}: nothing was loaded into {unchanged[:3]}'
                            f'{" ..." if len(unchanged) > 3 else ""}: the weights did not '
                            f'change. Hint: {hint}')
            if wrong:
                raise _Fail(f'{case}: after loading, {wrong[:3]} differ from the checkpoint. '
                            'Hint: copy every tensor of the checkpoint, buffers included.')
        misfits = [('without the key', lambda sd, k: {j: v for j, v in sd.items() if j != k}),
                   ('with an extra key', lambda sd, k: {**sd, 'module.extra.weight':
                                                        torch.zeros(2)}),
                   ('with a wrong shape for', lambda sd, k: {**sd, k: torch.zeros(
                       sd[k].numel() + 1, dtype=sd[k].dtype)})]
        for what, damage in misfits:
            # BatchNorm fills in a missing num_batches_tracked itself (old checkpoints lack it).
            key = rng.choice(sorted(k for k in wrapped if not k.endswith('num_batches_tracked')))
            checkpoint = damage(dict(wrapped), key)
            label = what if what == 'with an extra key' else f'{what} {key!r}'
            case = f'an nn.DataParallel checkpoint of {name} {label}'
            try:
                load_checkpoint(make(), checkpoint)
            except NotImplementedError:
                raise _Fail(f'{case}: your code raised NotImplementedError; finish it.') from None
            except Exception:
                continue  # refusing is right: any error that stops the load will do
            raise _Fail(f'{case} loaded without an error, so a checkpoint that does not fit '
                        'the net would go unnoticed. Hint: strict=False silently ignores '
                        'missing and unexpected keys; strip the prefix yourself and keep '
                        'strict=True (the default).')
    return ('DataParallel and plain checkpoints of 2 nets (one with a layer named '
            '`submodule`) load exactly, buffers included; checkpoints with a missing or an '
            'extra key or a wrong shape are refused.')


# ---------------------------------------------------------------- notebook 4

def _gpipe_idle(stage_times, m, backward=1.0):
    """Return the idle share of GPipe with stage i taking stage_times[i] per forward, simulated.

    Forward: micro-batch j enters stage i when stage i-1 has finished it and
    stage i has finished j-1. Backward runs the other way, in the order
    m-1 .. 0, each task taking `backward` times the stage's forward time.
    """
    p = len(stage_times)
    done = [0.0] * p  # when stage i finished its latest task
    for j in range(m):
        for i, t in enumerate(stage_times):
            done[i] = max(done[i], done[i - 1] if i else 0.0) + t
    for j in range(m):
        for i in reversed(range(p)):
            done[i] = max(done[i], done[i + 1] if i + 1 < p else 0.0) + backward * stage_times[i]
    busy = (1 + backward) * m * sum(stage_times)
    return 1 - busy / (p * max(done))


_WRONG_BUBBLES = (
    (lambda t, m: (len(t) - 1) / (m + len(t) - 1),
     'that is the bubble of equal stages, (p-1)/(m+p-1): with unequal stages the slowest one '
     'sets the pace and the others wait for it.'),
    (lambda t, m: 1 - m * sum(t) / (len(t) * max(t) * (m + len(t) - 1)),
     'filling and draining the pipeline takes sum(stage_times) (each stage its own time), not '
     'p times the slowest; only the m - 1 micro-batches after the first go at the slowest '
     "stage's pace."),
    (lambda t, m: (len(t) - 1) / len(t),
     'that is model parallelism without micro-batches overlapping: one stage works at a time.'),
    (lambda t, m: 1 - _gpipe_idle(t, m), 'that is the busy share; the bubble is the idle share.'),
    (lambda t, m: 100 * _gpipe_idle(t, m), 'return a fraction between 0 and 1, not a percentage.'),
)


@_checker('unbalanced_bubble(stage_times, num_microbatches)', 'unbalanced_bubble')
def check_unbalanced_bubble(unbalanced_bubble, rng):
    """Check `unbalanced_bubble(stage_times, m)`, the idle share of GPipe with unequal stages.

    Stage i needs stage_times[i] per micro-batch forward (and the same, or any
    fixed multiple, backward). The reference is a simulation of the schedule;
    with equal stages it gives (p-1)/(m+p-1), as d2lpar.pipeline_schedule does.
    """
    cases = [([1.0], 4), ([1.0] * 4, 4), ([1.0] * 4, 1), ([1.0, 3.0], 3), ([3.0, 1.0, 1.0, 1.0], 8),
             ([2.0, 2.0, 2.0], 16)]
    cases += [([round(rng.uniform(0.5, 3.0), 2) for _ in range(rng.randint(2, 6))],
               rng.randint(1, 32)) for _ in range(6)]
    for k, (times, m) in enumerate(cases):
        case = f'unbalanced_bubble({times}, {m})'
        got = _call(unbalanced_bubble, (list(times), m), case, first=k == 0)
        expected = _gpipe_idle(times, m)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise _Fail(f'{case} returned {got!r}; return a number between 0 and 1.')
        if not math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9):
            hints = [h for f, h in _WRONG_BUBBLES
                     if math.isclose(got, f(times, m), rel_tol=1e-6, abs_tol=1e-9)]
            hint = ' Or: '.join(hints) or (
                'draw the forward pass: when does the last micro-batch leave the last stage? '
                'The bubble is 1 - busy / (p * span), with each stage busy m * its time per '
                'phase.')
            raise _Fail(f'{case} returned {got:.6g}, expected {expected:.6g} '
                        f'({len(times)} stage(s), {m} micro-batch(es)). Hint: {hint}')
    return (f'{len(cases)} pipelines (1 to 6 stages, equal and unequal stage times, 1 to 32 '
            'micro-batches) match the simulated GPipe schedule.')


# ---------------------------------------------------------------- notebook 5

class _Sized:
    """A stand-in dataset: only its length matters to a sampler."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def _torch_unpadded(n, k, rank, shuffle, seed, epoch):
    """Return DistributedSampler's indices for `rank` with the padding taken off."""
    return _torch_padded(n, k, rank, shuffle, seed, epoch)[:len(range(rank, n, k))]


def _torch_padded(n, k, rank, shuffle, seed, epoch):
    """Return DistributedSampler's indices for `rank`, padding included."""
    sampler = torch.utils.data.DistributedSampler(_Sized(n), num_replicas=k, rank=rank,
                                                  shuffle=shuffle, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def _shard(Sampler, n, k, rank, shuffle, seed, epoch, case, first=False):
    sampler = _call(Sampler, (_Sized(n),), case, first,
                    dict(num_replicas=k, rank=rank, shuffle=shuffle, seed=seed))
    if epoch is not None:
        _call(sampler.set_epoch, (epoch,), f'{case}, set_epoch({epoch})')
    indices = _call(lambda: [int(i) for i in sampler], (), f'{case}, iterating')
    length = _call(len, (sampler,), f'{case}, len(sampler)')
    return indices, length


@_checker('UnpaddedSampler(dataset, num_replicas, rank, shuffle, seed)', 'UnpaddedSampler')
def check_sampler(Sampler, rng):
    """Check a DistributedSampler that shards without padding.

    `Sampler(dataset, num_replicas=k, rank=r, shuffle=..., seed=...)` with
    `set_epoch`, `__iter__` and `__len__` must give each index to exactly one
    rank, in DistributedSampler's order (a permutation seeded by seed + epoch,
    split rank::num_replicas) minus its padding.
    """
    cases = [(10, 3), (12, 4), (2, 4), (1, 2), (7, 1)]
    cases += [(rng.randint(1, 60), rng.randint(2, 6)) for _ in range(4)]
    first = True
    for n, k in cases:
        for shuffle in (True, False):
            seed, epoch = rng.randint(0, 1000), rng.randint(1, 20)
            setting = f'{n} samples, {k} ranks, shuffle={shuffle}, seed={seed}, epoch {epoch}'
            shards, owner = [], {}
            for rank in range(k):
                case = f'{setting}: rank {rank}'
                indices, length = _shard(Sampler, n, k, rank, shuffle, seed, epoch, case, first)
                first = False
                if length != len(indices):
                    raise _Fail(f'{case}: len(sampler) is {length}, but iterating gives '
                                f'{len(indices)} indices. Hint: without padding the shards '
                                'differ in size: rank r gets len(range(r, n, num_replicas)).')
                for i in indices:
                    if not 0 <= i < n:
                        raise _Fail(f'{case}: index {i} is not in the dataset (0..{n - 1}).')
                    if i in owner:
                        padded = indices == _torch_padded(n, k, rank, shuffle, seed, epoch)
                        raise _Fail(f'{case}: index {i} is served twice (to rank {owner[i]} '
                                    f'and rank {rank}). Hint: ' + (
                                        'that is the padding DistributedSampler adds to make '
                                        'the shards equal; here each index must appear once.'
                                        if padded else
                                        'do all ranks shuffle with the same permutation? Seed '
                                        'a torch.Generator with seed + epoch on every rank, '
                                        'then give each rank its own positions.'))
                    owner[i] = rank
                shards.append(indices)
            missing = sorted(set(range(n)) - set(owner))
            if missing:
                raise _Fail(f'{setting}: indices {missing[:5]} are served to no rank. Hint: '
                            'dropping the remainder (like drop_last=True) loses samples; '
                            'every index must go to some rank.')
            for rank, indices in enumerate(shards):
                expected = _torch_unpadded(n, k, rank, shuffle, seed, epoch)
                if indices != expected:
                    stale = _torch_unpadded(n, k, rank, shuffle, seed, 0)
                    hint = ('set_epoch had no effect: the order is that of epoch 0. Seed the '
                            'permutation with seed + epoch, or every epoch repeats it.'
                            if shuffle and indices == stale else
                            'use DistributedSampler\'s order: torch.randperm(n, generator=g) '
                            'with g.manual_seed(seed + epoch) (range(n) without shuffle), then '
                            'take indices[rank::num_replicas].')
                    raise _Fail(f'{setting}: rank {rank} gets {indices[:8]}'
                                f'{"..." if len(indices) > 8 else ""}, DistributedSampler '
                                f'without padding gives {expected[:8]}'
                                f'{"..." if len(expected) > 8 else ""}. Hint: {hint}')
    for n, k, rank in [(10, 3, 3), (10, 3, -1)]:
        case = f'a sampler for rank {rank} of {k} ranks'
        try:
            Sampler(_Sized(n), num_replicas=k, rank=rank, shuffle=True, seed=0)
        except NotImplementedError:
            raise _Fail(f'{case}: your code raised NotImplementedError; finish it.') from None
        except Exception:
            continue
        raise _Fail(f'{case} was created without complaint. Hint: ranks go from 0 to '
                    'num_replicas - 1; raise ValueError for anything else, as '
                    'DistributedSampler does.')
    return (f'{len(cases)} datasets, with and without shuffling, are split into disjoint '
            'shards that cover every index once, in DistributedSampler\'s order without its '
            'padding; set_epoch reshuffles and bad ranks are refused.')


# ---------------------------------------------------------------- notebook 6

def _slot_tensors(rng, generator, k, shape, dtype):
    slots = device_slots(k, verbose=False)
    if dtype.is_floating_point:
        values = [torch.randn(shape, generator=generator, dtype=dtype) for _ in range(k)]
    else:
        values = [torch.randint(-50, 50, shape, generator=generator, dtype=dtype)
                  for _ in range(k)]
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
        if isinstance(target, torch.Tensor) and target.numel() and \
                _memory(target) in self.storages:
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
    cases = [(2, (6,), torch.float32), (3, (2,), torch.float32), (1, (5,), torch.float32),
             (4, (0,), torch.float32), (3, (7,), torch.int64), (4, (3, 5), torch.float32)]
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
            raise _Fail(f'{case}: after your allreduce some entries of data share memory (the '
                        'same tensor on several slots). Hint: the replicas alias: the next '
                        'update of one changes all, and each slot no longer has its own copy. '
                        'Write the total into each slot\'s own tensor with .copy_(...).')
        for i, (t, original) in enumerate(zip(data, originals)):
            if t is not original:
                raise _Fail(f'{case}: data[{i}] is a new tensor, so the tensor the caller holds '
                            '(e.g. a parameter\'s .grad) did not change. Hint: `x = ...` or '
                            '`data[i] = ...` rebinds a name; write into the tensor instead: '
                            'data[i].copy_(...), data[i] += ..., or a chunk view\'s += / copy_.')
            if t.device != original.device or t.dtype != inputs[i].dtype:
                raise _Fail(f'{case}: data[{i}] is now on {t.device} with dtype {t.dtype}; keep '
                            f'it on {original.device} with dtype {inputs[i].dtype}.')
        for i, t in enumerate(data):
            got = t.detach().cpu().double()
            if torch.allclose(got, expected, rtol=1e-5, atol=1e-5):
                continue
            wrong = ~torch.isclose(got, expected, rtol=1e-5, atol=1e-5)
            single = torch.zeros_like(wrong)
            for x in inputs:
                single |= torch.isclose(got, x.double(), rtol=1e-5, atol=1e-5)
            if torch.equal(got, inputs[i].double()) and k > 1:
                hint = (f'data[{i}] is unchanged: nothing was written into it. Did you assign '
                        'a result to a local name (`chunk = ...`) instead of updating the '
                        'tensor (`chunk += ...`, `chunk.copy_(...)`)?')
            elif bool(single[wrong].all()):
                hint = ('the wrong values are single slots\' values, not sums: a received '
                        'chunk was assigned where it should be added. In the reduce-scatter '
                        'steps add it in place (+=); only the all-gather steps copy.')
            elif torch.allclose(got, expected / k, rtol=1e-5, atol=1e-5):
                hint = 'that is the mean; an allreduce here sums (divide later, in the update).'
            elif torch.allclose(got, 2 * expected, rtol=1e-5, atol=1e-5):
                hint = 'every value is counted twice: did you add a slot\'s own chunk to itself?'
            else:
                wrong = wrong.flatten()
                hint = (f'{int(wrong.sum())} of {wrong.numel()} values are off (first at flat '
                        f'index {int(wrong.nonzero()[0])}). With n slots there are n - 1 '
                        'reduce-scatter steps (add) and n - 1 all-gather steps (copy); check '
                        'which chunk each slot sends at each step.')
            raise _Fail(f'{case}: data[{i}] is not the sum of the inputs. Hint: {hint}')
        numel, chunk = inputs[0].numel(), math.ceil(inputs[0].numel() / k)
        if k > 1 and numel >= k and max(writes, default=0) > chunk:
            raise _Fail(f'{case}: the sums are right, but not computed by a ring: one write into '
                        f'a slot\'s tensor covered {max(writes)} elements, more than a chunk '
                        f'({chunk} = ceil({numel} / {k})). Hint: that is the naive allreduce '
                        '(everything through one place, then copied back). Cut each tensor '
                        'into k chunks (t.view(-1).tensor_split(k)) and, at every step, let '
                        'each slot pass one chunk to its neighbour: add it during the k - 1 '
                        'reduce-scatter steps, copy it during the k - 1 all-gather steps.')
    return (f'{len(cases)} allreduces (1 to 6 slots; float and int; empty tensors and tensors '
            'with fewer elements than slots) leave the exact sum in every slot\'s own tensor, '
            'written one chunk at a time as a ring does.')


def _place_label(device):
    return 'meta (a device without data the checker uses to see placement)' \
        if torch.device(device).type == 'meta' else str(device)


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
            hint = (' torch.chunk makes parts of ceil(n/k) rows and can run out of rows '
                    'before the devices run out.' if len(X_parts) < k else '')
            raise _Fail(f'{case}: got {len(X_parts)} X parts and {len(y_parts)} y parts; each '
                        f'of the {k} devices needs one.{hint}')
        if sum(sizes) != rows:
            raise _Fail(f'{case}: the parts hold {sum(sizes)} of {rows} rows (sizes {sizes}). '
                        f'Hint: {rows} % {k} = {rows % k} rows are left over when every part '
                        'gets n // k; give one extra row to each of the first n % k parts '
                        'instead of dropping them.')
        if max(sizes) - min(sizes) > 1 or sizes != [len(e) for e in expected]:
            raise _Fail(f'{case}: part sizes {sizes}, expected {[len(e) for e in expected]}. '
                        'Hint: sizes may differ by at most one, the larger parts first, as '
                        'torch.tensor_split makes them (torch.chunk does not balance them).')
        for j, (xp, yp, d) in enumerate(zip(X_parts, y_parts, devices)):
            if xp.device != d or yp.device != d:
                raise _Fail(f'{case}: part {j} is on {xp.device}/{yp.device}, not on '
                            f'devices[{j}] = {d}.')
            if not (torch.equal(xp.cpu(), X[expected[j]]) and torch.equal(yp.cpu(), y[expected[j]])):
                raise _Fail(f'{case}: part {j} does not hold rows {expected[j].tolist()} of X and '
                            'y. Hint: keep the rows in order, and split X and y at the same '
                            'places so each example keeps its label.')
    devices = [torch.device('cpu'), torch.device('meta')]
    case = 'split_batch of 5 rows across [cpu, meta]'
    got = _call(split_batch, (torch.randn(5, 3), torch.arange(5), devices), case)
    for j, d in enumerate(devices):
        for what, part in (('X', got[0][j]), ('y', got[1][j])):
            if part.device != d:
                raise _Fail(f'{case}: {what} part {j} is on {part.device}, not on '
                            f'{_place_label(d)}. Hint: move each part with .to(devices[k]).')
    for rows, k in [(3, 4), (0, 2)]:
        case = f'split_batch of {rows} rows across {k} devices'
        try:
            split_batch(torch.randn(rows, 2), torch.arange(rows), device_slots(k, verbose=False))
        except NotImplementedError:
            raise _Fail(f'{case}: your code raised NotImplementedError; finish it.') from None
        except ValueError:
            continue
        except Exception as e:
            raise _Fail(f'{case} raised {type(e).__name__}: {e}; a batch too small for the '
                        'devices should raise ValueError saying so.') from None
        raise _Fail(f'{case} did not raise: a device would get no rows. Hint: raise ValueError '
                    'when there are fewer rows than devices, so the experiment does not '
                    'silently change.')
    return (f'{len(cases)} batches (sizes that divide and sizes that do not) are split into '
            'balanced parts on the right devices with no row lost; too-small batches are refused.')


# ---------------------------------------------------------------- notebook 7

def _rounds(schedule, case):
    """Return the schedule as a list of rounds of (sender, receiver) int pairs, or _Fail."""
    problem = (f'{case} returned {schedule!r:.120}; return a list of rounds, each a list of '
               '(sender, receiver) pairs, e.g. [[(0, 1)], [(0, 2), (1, 3)]].')
    if isinstance(schedule, (str, bytes)) or not hasattr(schedule, '__iter__'):
        raise _Fail(problem)
    rounds = []
    for r in schedule:
        if isinstance(r, (str, bytes)) or not hasattr(r, '__iter__'):
            raise _Fail(problem)
        pairs = []
        for pair in r:
            if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)):
                raise _Fail(problem)
            pairs.append(tuple(pair))
        if pairs:  # an empty round sends nothing and costs nothing
            rounds.append(pairs)
    return rounds


@_checker('broadcast_schedule(n, src)', 'broadcast_schedule')
def check_broadcast_schedule(broadcast_schedule, rng):
    """Check `broadcast_schedule(n, src)`: rounds of (sender, receiver) pairs of a tree broadcast.

    Rank `src` starts with the data. In a round every rank sends at most one
    message and receives at most one, and only a rank that has the data may
    send it. After the last round every rank has it, in ceil(log2 n) rounds,
    the fewest possible (the number of ranks holding it can at most double per
    round). The reference is that hand calculation and a simulation of the rounds.
    """
    cases = [(1, 0), (2, 0), (2, 1), (4, 0), (5, 0), (6, 3), (7, 6), (8, 5), (16, 0)]
    cases += [(n, rng.randrange(n)) for n in (rng.randint(3, 40) for _ in range(5))]
    for k, (n, src) in enumerate(cases):
        case = f'broadcast_schedule({n}, src={src})'
        rounds = _rounds(_call(broadcast_schedule, (n, src), case, first=k == 0), case)
        have = {src}
        for r, pairs in enumerate(rounds, 1):
            senders = [s for s, _ in pairs]
            receivers = [d for _, d in pairs]
            for s, d in pairs:
                if not (0 <= s < n and 0 <= d < n) or s == d:
                    raise _Fail(f'{case}, round {r}: ({s}, {d}) is not a message between two '
                                f'different ranks of 0..{n - 1}.')
                if s not in have:
                    hint = ('work with ranks relative to the source, (rank - src) % n, and '
                            'map back with (relative + src) % n.' if src else
                            'data received in a round can be sent on from the next round on.')
                    raise _Fail(f'{case}, round {r}: rank {s} sends before it has the data '
                                f'(holders before this round: {sorted(have)}). Hint: {hint}')
            busy = next((x for x in senders if senders.count(x) > 1), None)
            if busy is not None:
                raise _Fail(f'{case}, round {r}: rank {busy} sends {senders.count(busy)} '
                            'messages. Hint: a rank has one link, so a round is one message '
                            'time and each rank sends at most one message per round; '
                            'sending to everyone from src takes n - 1 rounds.')
            twice = next((x for x in receivers if receivers.count(x) > 1), None)
            if twice is not None:
                raise _Fail(f'{case}, round {r}: rank {twice} receives more than one message.')
            already = [d for d in receivers if d in have]
            if already:
                raise _Fail(f'{case}, round {r}: rank {already[0]} already has the data; that '
                            'message is wasted.')
            have |= set(receivers)
        missing = sorted(set(range(n)) - have)
        if missing:
            raise _Fail(f'{case}: ranks {missing[:8]} never get the data. Hint: when n is not a '
                        'power of two, the last round only reaches the ranks that remain; '
                        'skip partners >= n rather than stopping early.')
        best = math.ceil(math.log2(n)) if n > 1 else 0
        if len(rounds) != best:
            raise _Fail(f'{case}: every rank gets the data, but in {len(rounds)} rounds; a tree '
                        f'needs {best}. Hint: in each round every rank that has the data sends '
                        'it to one that does not, so the holders double.')
    return (f'{len(cases)} broadcasts (1 to 40 ranks, any source) reach every rank in '
            'ceil(log2 n) rounds, with one message per rank and round.')
