"""Checker of notebook 3: loading a DataParallel checkpoint."""

import torch
from torch import nn

from ._verdict import _call, _checker, _Fail


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
    return [
        (
            'nn.Sequential(Linear, BatchNorm1d, ReLU, Linear)',
            lambda h=hidden: nn.Sequential(nn.Linear(5, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Linear(h, 2)),
        ),
        ('a net with a layer named `submodule`', lambda h=hidden: _Block(h)),
    ]


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
            hint = (
                'this checkpoint fits the net, so it must load. If the error lists keys '
                "such as 'subweight', .replace('module.', '') also cut 'module.' out of the "
                "middle of a name ('submodule.weight'); if it lists 'coder.weight', "
                ".lstrip('module.') removed every leading m, o, d, u, l, e and '.' (it takes "
                "a set of characters, not a prefix). Strip only a leading 'module.'."
                if kind == 'nn.DataParallel'
                else "a checkpoint saved from the plain net has no 'module.' prefix: strip the "
                'prefix only when the keys have it, and load a plain checkpoint as it is.'
            )
            net, before = _load_into_fresh(load_checkpoint, make, dict(checkpoint), case, first, hint)
            first = False
            after = net.state_dict()
            if set(after) != set(reference):
                raise _Fail(
                    f'{case}: the net now has the keys {sorted(after)}, expected '
                    f'{sorted(reference)}. Load into the net you are given; do not '
                    'wrap it or rename its layers.'
                )
            unchanged = [
                k
                for k in reference
                if torch.equal(after[k].cpu(), before[k].cpu()) and not torch.equal(before[k].cpu(), reference[k].cpu())
            ]
            wrong = [k for k in reference if not torch.equal(after[k].cpu(), reference[k].cpu())]
            if unchanged and len(unchanged) == len(wrong):
                hint = (
                    (
                        "its keys start with 'module.' (the wrapper's attribute), the net's do "
                        "not: strip that leading prefix. With strict=False, load_state_dict "
                        "skips every key that does not match without a word, which is why "
                        "nothing told you."
                    )
                    if kind == 'nn.DataParallel'
                    else 'a plain checkpoint has no prefix to strip: load its keys as they are.'
                )
                raise _Fail(
                    f'{case}: nothing was loaded into {unchanged[:3]}'
                    f'{" ..." if len(unchanged) > 3 else ""}: the weights did not '
                    f'change. Hint: {hint}'
                )
            if wrong:
                raise _Fail(
                    f'{case}: after loading, {wrong[:3]} differ from the checkpoint. '
                    'Hint: copy every tensor of the checkpoint, buffers included.'
                )
        misfits = [
            ('without the key', lambda sd, k: {j: v for j, v in sd.items() if j != k}),
            ('with an extra key', lambda sd, k: {**sd, 'module.extra.weight': torch.zeros(2)}),
            ('with a wrong shape for', lambda sd, k: {**sd, k: torch.zeros(sd[k].numel() + 1, dtype=sd[k].dtype)}),
        ]
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
            raise _Fail(
                f'{case} loaded without an error, so a checkpoint that does not fit '
                'the net would go unnoticed. Hint: strict=False silently ignores '
                'missing and unexpected keys; strip the prefix yourself and keep '
                'strict=True (the default).'
            )
    return (
        'DataParallel and plain checkpoints of 2 nets (one with a layer named '
        '`submodule`) load exactly, buffers included; checkpoints with a missing or an '
        'extra key or a wrong shape are refused.'
    )
