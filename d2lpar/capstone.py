"""The capstone (notebook 17): one small GPT trained under every layout of a device mesh.

A layout is a dictionary of degrees (pp, dp, fsdp, cp, tp) that multiply to the
number of processes. `layout_mesh` makes the named DeviceMesh, `parallelize`
cuts, splits and shards a `TinyGPT` with torch's APIs (pipelining,
parallelize_module with sequence parallelism, fully_shard) and points its
attention at notebook 14's ring attention over cp, `train_step` trains this
rank's share (its zig-zag chunks of the sequences under cp; gradients averaged
by hand over dp and cp), and `StepCost` counts the
bytes every collective of a step sends, with peak memory (notebook 10's
StepMemory). `layout_cost` is the first-order cost model. The algorithms are
written in notebook 17's cells (marked `#@save`) and are the same code here;
argument checks run first, in `@checked`.
"""
import copy
import math
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)
from torch.nn import functional as F

from ._checks import checked, positive_int, process_group_size
from .context_parallel import ring_attention, shard_sequence
from .memory import StepMemory

__all__ = ['CausalAttention', 'GPTBlock', 'TinyGPT', 'lm_loss', 'counting_task', 'DIMS', 'layout_mesh',
           'coordinates', 'pipeline_stage', 'tensor_plan', 'parallelize', 'average_gradients',
           'train_step', 'full_parameters', 'RING', 'StepCost', 'layout_cost']


class CausalAttention(nn.Module):
    """Multi-head causal self-attention; each head sees only the tokens before it."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.head_dim = dim // num_heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.cp_group = None  # context parallelism: the group whose ranks hold the rest of the sequence

    def forward(self, X):
        B, T = X.shape[:2]  # -1 heads: all of them, or this rank's under tensor parallelism
        q, k, v = (f(X).view(B, T, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        if self.cp_group is None:
            Y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # this rank holds zig-zag chunks of each sequence; keys and values go round a ring
            Y = ring_attention(q, k, v, group=self.cp_group)
        return self.out(Y.transpose(1, 2).reshape(B, T, -1))


class GPTBlock(nn.Module):
    """A pre-norm decoder block: X + attention(norm1(X)), then X + mlp(norm2(X))."""

    def __init__(self, dim, num_heads, hidden):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = CausalAttention(dim, num_heads)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, X):
        X = X + self.attention(self.norm1(X))
        return X + self.mlp(self.norm2(X))


class TinyGPT(nn.Module):
    """Token embedding, decoder blocks, a final norm and a head to the vocabulary's logits.

    A pipeline stage is a TinyGPT with some parts removed (None): the first stage keeps the
    embedding, the last the norm and the head; the blocks keep their names ('0', '1', ...).
    """

    def __init__(self, vocab=16, dim=16, num_heads=4, hidden=64, num_layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleDict({str(i): GPTBlock(dim, num_heads, hidden) for i in range(num_layers)})
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, X):
        if self.embed is not None:
            X = self.embed(X)
        for block in self.blocks.values():
            X = block(X)
        if self.head is not None:
            X = self.head(self.norm(X))
        return X


def lm_loss(logits, y):
    """The mean cross-entropy of the next-token predictions over all tokens."""
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def counting_task(num_seqs, seq_len, vocab, seed=0):
    """Return (X, y): sequences counting up mod vocab by a stride 1-3; y is X shifted by one."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (num_seqs, 1), generator=g)
    stride = torch.randint(1, 4, (num_seqs, 1), generator=g)
    tokens = (start + stride * torch.arange(seq_len + 1)) % vocab
    return tokens[:, :-1], tokens[:, 1:]


DIMS = ('pp', 'dp', 'fsdp', 'cp', 'tp')  # outermost to innermost: tp's ranks are neighbours


def _check_degrees(caller, layout):
    if not isinstance(layout, dict):
        raise TypeError(f'{caller}: layout must be a dict of degrees such as dict(dp=2, tp=2), '
                        f'got {type(layout).__name__}')
    unknown = sorted(set(layout) - set(DIMS))
    if unknown:
        raise ValueError(f'{caller}: unknown dimension(s) {unknown}; a layout names degrees of '
                         f'{", ".join(DIMS)} (expert parallelism is not built here: this GPT has no experts)')
    for name, degree in layout.items():
        positive_int(degree, f'{caller}: the degree of {name!r}')


def _check_layout_mesh(layout):
    _check_degrees('layout_mesh', layout)
    world_size = process_group_size('layout_mesh')
    product = math.prod(layout.values())
    if product != world_size:
        raise ValueError(f'layout_mesh: the degrees of {layout} multiply to {product}, but there are '
                         f'{world_size} processes; choose degrees whose product is {world_size}')
    if world_size == 1:
        raise ValueError('layout_mesh: one process needs no mesh; run the model as it is')


def _check_layout_cost(layout, num_params, tokens, dim, num_layers, bytes_per_value=4):
    _check_degrees('layout_cost', layout)
    for name, value in (('num_params', num_params), ('tokens', tokens), ('dim', dim),
                        ('num_layers', num_layers), ('bytes_per_value', bytes_per_value)):
        positive_int(value, f'layout_cost: {name}')


@checked(_check_layout_mesh)
def layout_mesh(layout):
    """Return a DeviceMesh with one named dimension per degree above 1 of `layout`."""
    names = tuple(name for name in DIMS if layout.get(name, 1) > 1)
    return init_device_mesh('cpu', tuple(layout[name] for name in names), mesh_dim_names=names)


def coordinates(mesh, layout):
    """Return this rank's index along every dimension of `layout` (0 where the degree is 1)."""
    return {name: mesh[name].get_local_rank() if layout.get(name, 1) > 1 else 0 for name in DIMS}


def pipeline_stage(net, stage, num_stages):
    """Return a copy of `net` keeping only stage `stage`'s part: an equal share of the blocks."""
    net = copy.deepcopy(net)
    names = list(net.blocks)
    per_stage = len(names) // num_stages
    for name in names[:stage * per_stage] + names[(stage + 1) * per_stage:]:
        del net.blocks[name]
    if stage > 0:
        net.embed = None
    if stage < num_stages - 1:
        net.norm = net.head = None
    return net


def tensor_plan(net, norm_style=SequenceParallel):
    """Return parallelize_module's plan: heads and MLP split, the rest sequence parallel."""
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan = {}
    if net.embed is not None:  # rows of the table split; the output split by tokens
        plan['embed'] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    for name in net.blocks:
        b = f'blocks.{name}'
        plan.update({f'{b}.norm1': norm_style(), f'{b}.attention': gather,
                     f'{b}.attention.q': ColwiseParallel(), f'{b}.attention.k': ColwiseParallel(),
                     f'{b}.attention.v': ColwiseParallel(),
                     f'{b}.attention.out': RowwiseParallel(output_layouts=Shard(1)),
                     f'{b}.norm2': norm_style(), f'{b}.mlp': gather, f'{b}.mlp.0': ColwiseParallel(),
                     f'{b}.mlp.2': RowwiseParallel(output_layouts=Shard(1))})
    if net.head is not None:  # the logits gathered whole: the loss sees every token
        plan.update({'norm': norm_style(),
                     'head': ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
    return plan


def parallelize(net, layout, mesh, microbatches=2, broken=()):
    """Return this rank's (module, schedule): `net` cut, split and sharded as `layout` says.

    `broken` names bugs to plant: 'sp_norm' (norms outside sequence parallelism),
    'pp_scale' (micro-batch gradients summed, not averaged).
    """
    at = coordinates(mesh, layout)
    if layout.get('pp', 1) > 1:
        net = pipeline_stage(net, at['pp'], layout['pp'])
    if layout.get('cp', 1) > 1:  # every attention a ring over cp
        for block in net.blocks.values():
            block.attention.cp_group = mesh['cp'].get_group()
    if layout.get('tp', 1) > 1:
        plan = tensor_plan(net)
        if 'sp_norm' in broken:  # the norms run on the rank's tokens with ordinary parameters
            plan = {name: style for name, style in plan.items() if 'norm' not in name}
        parallelize_module(net, mesh['tp'], plan)
    if layout.get('fsdp', 1) > 1:
        for block in net.blocks.values():
            fully_shard(block, mesh=mesh['fsdp'])
        fully_shard(net, mesh=mesh['fsdp'])
    if layout.get('pp', 1) == 1:
        return net, None
    stage = PipelineStage(net, at['pp'], layout['pp'], torch.device('cpu'), group=mesh['pp'].get_group())
    return net, ScheduleGPipe(stage, n_microbatches=microbatches, loss_fn=lm_loss,
                              scale_grads='pp_scale' not in broken)


def average_gradients(net, group, size, divide=True):
    """All-reduce (sum) every gradient over `group`'s `size` ranks, then divide by `size`."""
    with torch.no_grad():
        for p in net.parameters():
            grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(grad, group=group)
            if divide:
                grad /= size


def train_step(net, schedule, opt, X, y, layout, mesh, broken=()):
    """One SGD step on this rank's share of the batch; return its loss (None off the last stage).

    `broken` may also name 'dp_average' (data-parallel gradients summed, not averaged).
    """
    at, fsdp = coordinates(mesh, layout), layout.get('fsdp', 1)
    shares = layout.get('dp', 1) * fsdp
    X, y = X.chunk(shares)[at['dp'] * fsdp + at['fsdp']], y.chunk(shares)[at['dp'] * fsdp + at['fsdp']]
    if layout.get('cp', 1) > 1:  # this rank's zig-zag chunks of every sequence, as ring attention expects
        X, y = (shard_sequence(t.unsqueeze(-1), layout['cp'], at['cp']).squeeze(-1) for t in (X, y))
    opt.zero_grad()
    if schedule is None:
        loss = lm_loss(net(X), y)
        loss.backward()
        loss = loss.item()
    else:
        losses, last = [], at['pp'] == layout['pp'] - 1
        schedule.step(*([X] if at['pp'] == 0 else []), **(dict(target=y, losses=losses) if last else {}))
        loss = torch.stack(losses).mean().item() if last else None
    if layout.get('dp', 1) > 1:
        average_gradients(net, mesh['dp'].get_group(), layout['dp'], divide='dp_average' not in broken)
    if layout.get('cp', 1) > 1:  # each cp rank's loss is the mean over its tokens: average them too
        average_gradients(net, mesh['cp'].get_group(), layout['cp'])
    opt.step()
    return loss


def full_parameters(net):
    """Return {name: the whole parameter} of this rank's module (DTensors gathered)."""
    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach()
            for name, p in net.named_parameters()}


RING = {  # bytes one rank sends per byte of the collective's input, n ranks (ring algorithms)
    'allreduce_': lambda n: 2 * (n - 1) / n, 'all_reduce': lambda n: 2 * (n - 1) / n,
    '_allgather_base_': lambda n: n - 1, 'all_gather_into_tensor': lambda n: n - 1,  # its input
    '_reduce_scatter_base_': lambda n: (n - 1) / n, 'reduce_scatter_tensor': lambda n: (n - 1) / n,
    'send': lambda n: 1}


def _group_size(group):
    if isinstance(group, str):  # functional collectives name their group
        return dist.distributed_c10d._resolve_process_group(group).size()
    return dist.ProcessGroup.unbox(group).size()  # the dispatcher hands c10d ops a boxed group


class StepCost(StepMemory):
    """StepMemory that also counts the calls and bytes of every collective this rank runs in the step."""

    def __init__(self, *held):
        super().__init__(*held)
        self.sent, self.calls = {}, {}  # collective -> bytes, -> calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if DTensor in types:  # let DTensor run first: the collectives it runs inside come back here
            return NotImplemented
        name = func.__name__.split('.')[0]
        if func.namespace in ('c10d', '_c10d_functional') and name in RING:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name.endswith('base_'):  # (output, input, group, ...)
                tensor, group = args[1], args[2]
            elif func.namespace == 'c10d':  # ([tensor], group, ...)
                tensor, group = args[0][0], args[1]
            else:  # functional collectives: (input, ..., group name)
                tensor, group = args[0], args[-1]
            n = 2 if name == 'send' else _group_size(group)
            self.sent[name] = self.sent.get(name, 0) + RING[name](n) * tensor.numel() * tensor.element_size()
        return super().__torch_dispatch__(func, types, args, kwargs)


@checked(_check_layout_cost)
def layout_cost(layout, num_params, tokens, dim, num_layers, bytes_per_value=4):
    """Return (bytes a rank sends, bytes it holds) in one SGD step under `layout`: a first-order model.

    Parameters and gradients are split by fsdp, tp and pp; activations (about 16 values of
    `dim` per token and layer, all kept for backward) by the data shares, cp, tp and pp.
    """
    dp, fsdp, cp, tp, pp = (layout.get(name, 1) for name in ('dp', 'fsdp', 'cp', 'tp', 'pp'))
    ring = lambda n: (n - 1) / n
    state = num_params * bytes_per_value / (tp * pp)  # a rank's model before data parallelism
    act = tokens / (dp * fsdp * cp) * dim * bytes_per_value  # one activation of a rank's tokens
    sent = (2 * (ring(dp) + ring(cp)) * state / fsdp  # all-reduces of the (sharded) gradients
            + 3 * ring(fsdp) * state  # gather in forward, again in backward, reduce-scatter
            + 8 * ring(tp) * act * num_layers / pp  # 4 all-gathers, 4 reduce-scatters per block
            + ((6 * (cp - 1) + 2) * act / tp * num_layers / pp if cp > 1 else 0)  # ring attention's K, V (dK, dV)
            + (2 * act if pp > 1 else 0))  # a stage's output forward, its gradient back
    held = 2 * state / fsdp + 16 * act * num_layers / (tp * pp)
    return sent, held
