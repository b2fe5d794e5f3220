"""Reasoning at scale (notebook 17): one rank of a big job in one process, and a predictor checked against it.

`fake_step` runs one rank's real training step of a Llama 3 model under FSDP2 (and
tensor parallelism) with torch's `fake` process-group backend and `FakeTensorMode`:
every operation computes shapes only, nothing is allocated and nothing is sent, yet
FSDP2, DTensor, autograd and AdamW run their real code. It returns what the step
would do on that rank: its collectives and bytes, its FLOPs and its peak memory by
category. The predictor it is held against (`predict`, `check_mfu` and their parts) is taught in
notebook 17's `#@save` cells and generated into d2lpar/lessons/nb17_reasoning_at_scale.py (edit the
notebook, then `make lib`); this module re-exports it beside the tooling the notebook only calls.
"""

import contextlib
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .lessons.nb17_reasoning_at_scale import *  # noqa: F403
from .lessons.nb17_reasoning_at_scale import __all__ as _nb17

__all__ = [*_nb17, 'LLAMA3', 'PUBLISHED', 'Llama', 'fake_step', 'WIRE']

# Llama 3.1 shapes as torchtitan builds them (torchtitan/models/llama/__init__.py at commit
# 9dec370, the commit of its December 2024 benchmarks; the FFN width is torchtitan's rounding of
# ffn_dim_multiplier * 8/3 * dim up to multiple_of; the vocabulary is the Llama 3 tokenizer's).
LLAMA3 = {
    '8B': dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, hidden=14336, vocab=128256),
    '70B': dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, hidden=28672, vocab=128256),
    '405B': dict(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, hidden=53248, vocab=128256),
}

# torchtitan, benchmarks/llama3_h100_202412_torchtitan.md: Llama 3.1 on H100s, bf16 without
# Float8 or compile only (the rows this model can speak about), seq_len 8192 (the train configs
# at commit 9dec370). tps is tokens per second per GPU; memory is the reported peak in GiB.
PUBLISHED = [
    dict(zip(('source', 'model', 'gpus', 'tp', 'local_batch', 'ac', 'tps', 'memory_gib'), row))
    for row in [
        ('torchtitan Table 1, FSDP', '8B', 8, 1, 2, 'selective', 5762, 82.4),
        ('torchtitan Table 3, FSDP', '8B', 128, 1, 2, 'selective', 5605, 67.0),
    ]
]

aten = torch.ops.aten
_SAVE = {aten.mm.default, aten._scaled_dot_product_flash_attention_for_cpu.default}


def _selective_policy():
    """torchtitan's 'op' selective checkpointing: save matmul and attention outputs, except every second matmul."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    count = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = 'recompute' if ctx.is_recompute else 'forward'
        if func == aten.mm.default:
            count[key] += 1
        save = func in _SAVE and not (func == aten.mm.default and count[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Attention(nn.Module):
    """Grouped-query causal attention (no rotary embedding: it does no matmul)."""

    def __init__(self, dim, n_heads, n_kv_heads):
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x):
        b, t, _ = x.shape  # heads are counted with -1: under tensor parallelism a rank holds some
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        k, v = (z.repeat_interleave(q.shape[1] // z.shape[1], dim=1) for z in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg, ac='none'):
        super().__init__()
        self.ac = ac
        self.attention_norm, self.ffn_norm = nn.RMSNorm(cfg['dim']), nn.RMSNorm(cfg['dim'])
        self.attention = Attention(cfg['dim'], cfg['n_heads'], cfg['n_kv_heads'])
        self.feed_forward = FeedForward(cfg['dim'], cfg['hidden'])

    def _forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        if self.ac == 'full':
            return checkpoint(self._forward, x, use_reentrant=False)
        if self.ac == 'selective':
            return checkpoint(self._forward, x, use_reentrant=False, context_fn=_selective_policy)
        return self._forward(x)


class Llama(nn.Module):
    """A Llama 3 decoder with torchtitan's module names; `ac` is 'none', 'selective' or 'full'."""

    def __init__(self, cfg, n_layers=None, ac='none'):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg['vocab'], cfg['dim'])
        self.layers = nn.ModuleList(Block(cfg, ac) for _ in range(n_layers or cfg['n_layers']))
        self.norm = nn.RMSNorm(cfg['dim'])
        self.output = nn.Linear(cfg['dim'], cfg['vocab'], bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


# Bytes one rank sends per byte of the collective's input, n ranks, ring algorithms.
WIRE = {
    'all_gather_into_tensor': lambda n: n - 1,
    '_allgather_base_': lambda n: n - 1,
    'reduce_scatter_tensor': lambda n: (n - 1) / n,
    '_reduce_scatter_base_': lambda n: (n - 1) / n,
    'all_reduce': lambda n: 2 * (n - 1) / n,
    'allreduce_': lambda n: 2 * (n - 1) / n,
}


def _group_size(group):
    if isinstance(group, str):  # functional collectives name their group
        return dist.distributed_c10d._resolve_process_group(group).size()
    return dist.ProcessGroup.unbox(group).size()


def _comm_bytes_mode():
    """A CommDebugMode that also adds up the bytes this rank sends in each kind of collective."""
    from torch.distributed.tensor.debug import CommDebugMode

    class CommBytes(CommDebugMode):
        def __init__(self):
            super().__init__()
            self.sent = defaultdict(float)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split('.')[0]
            if func.namespace in ('c10d', '_c10d_functional') and name in WIRE:
                if name.endswith('base_'):  # (output, input, group, ...)
                    tensor, group = args[1], args[2]
                elif func.namespace == 'c10d':  # ([tensor], group, ...)
                    tensor, group = args[0][0], args[1]
                else:  # (input, ..., group name)
                    tensor, group = args[0], args[-1]
                kind = 'all-gather' if 'gather' in name else 'reduce-scatter' if 'scatter' in name else 'all-reduce'
                self.sent[kind] += WIRE[name](_group_size(group)) * tensor.numel() * tensor.element_size()
            return super().__torch_dispatch__(func, types, args, kwargs)

    return CommBytes()


def _flop_counter():
    """FlopCounterMode, taught the CPU flash-attention kernel (it knows only the GPU ones)."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

    def forward(q, k, v, *args, out_val=None, **kwargs):
        return sdpa_flop_count(q.shape, k.shape, v.shape)

    def backward(grad, q, k, v, *args, out_val=None, **kwargs):
        return sdpa_backward_flop_count(grad.shape, q.shape, k.shape, v.shape)

    forward._get_raw = backward._get_raw = True  # take the tensors, not their shapes
    return FlopCounterMode(
        display=False,
        custom_mapping={
            aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
        },
    )


def _tensor_parallel(net, tp_mesh):
    """torchtitan's Llama plan: sequence-parallel norms, column/row-parallel matmuls, loss parallel."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    gather = lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    parallelize_module(
        net,
        tp_mesh,
        {
            'tok_embeddings': RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            'norm': SequenceParallel(),
            'output': ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        },
    )
    for block in net.layers:
        parallelize_module(
            block,
            tp_mesh,
            {
                'attention_norm': SequenceParallel(),
                'attention': gather(),
                'attention.wq': ColwiseParallel(),
                'attention.wk': ColwiseParallel(),
                'attention.wv': ColwiseParallel(),
                'attention.wo': RowwiseParallel(output_layouts=Shard(1)),
                'ffn_norm': SequenceParallel(),
                'feed_forward': gather(),
                'feed_forward.w1': ColwiseParallel(),
                'feed_forward.w3': ColwiseParallel(),
                'feed_forward.w2': RowwiseParallel(output_layouts=Shard(1)),
            },
        )


@contextlib.contextmanager
def _propagation_unseen():
    """Hide DTensor's sharding propagation from the memory tracker.

    To find an output's global shape DTensor runs each operation once on fake tensors of the
    global shape (torch/distributed/tensor/_sharding_prop.py); in a real run they never hold
    memory, but inside our FakeTensorMode the tracker would count them: under loss parallelism,
    two fp32 tensors of the whole vocabulary's logits that no rank ever allocates.
    """
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.utils._python_dispatch import _disable_current_modes

    propagate = ShardingPropagator._propagate_tensor_meta_non_cached

    def unseen(self, op_schema):
        with _disable_current_modes():  # no tracker; DTensor makes its own FakeTensorMode
            return propagate(self, op_schema)

    ShardingPropagator._propagate_tensor_meta_non_cached = unseen
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = propagate


def fake_step(cfg, gpus, local_batch, seq_len, n_layers, ac='selective', tp=1, rank=0):
    """Run rank `rank`'s training step of `cfg` on `gpus` GPUs (FSDP x tp) with fake tensors and the fake backend.

    Mixed precision as torchtitan's default (bf16 compute, fp32 gradient reduction), AdamW.
    One step runs first, so that the optimizer state exists; the second is measured. Returns
    a dict: 'sent' (bytes per collective kind), 'calls' (collective -> count), 'flops',
    'peak' (bytes by category at the step's peak, and 'Total').
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if gpus % tp:
        raise ValueError(f'fake_step: tp={tp} must divide gpus={gpus}')
    if dist.is_initialized():
        raise RuntimeError('fake_step: a process group is already initialized; call it in a process without one')
    dist.init_process_group('fake', store=FakeStore(), rank=rank, world_size=gpus)
    try:
        mesh = init_device_mesh('cpu', (gpus // tp, tp), mesh_dim_names=('fsdp', 'tp'))
        with torch.device('meta'):  # shapes only: parallelize before any storage exists
            net = Llama(cfg, n_layers, ac)
        if tp > 1:
            _tensor_parallel(net, mesh['tp'])
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in net.layers:
            fully_shard(block, mesh=mesh['fsdp'], mp_policy=policy)
        fully_shard(net, mesh=mesh['fsdp'], mp_policy=policy)
        with FakeTensorMode(allow_non_fake_inputs=True):  # the mesh's small index tensors stay real
            net.to_empty(device='cpu')
            opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
            tokens = torch.randint(0, cfg['vocab'], (local_batch, seq_len))

            def step():
                with loss_parallel() if tp > 1 else contextlib.nullcontext():
                    loss = F.cross_entropy(net(tokens).flatten(0, 1).float(), tokens.flatten())
                    loss.backward()
                opt.step()
                opt.zero_grad()

            step()
            memory, flops, comm = FSDPMemTracker(net, opt), _flop_counter(), _comm_bytes_mode()
            with memory, flops, comm, _propagation_unseen():
                step()
            peak = memory.get_tracker_snapshot('peak')[torch.device('cpu')]
        return dict(
            sent=dict(comm.sent),
            flops=flops.get_total_flops(),
            calls={str(k).split('.')[-1]: v for k, v in comm.get_comm_counts().items()},
            peak={str(k).split('.')[-1].lower(): v for k, v in peak.items()},
        )
    finally:
        dist.destroy_process_group()
