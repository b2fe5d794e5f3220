"""Reasoning at scale (notebook 16): one rank of a big job in one process, and a predictor checked against it.

`fake_step` runs one rank's real training step of a Llama 3 model under FSDP2 (and
tensor parallelism) with torch's `fake` process-group backend and `FakeTensorMode`:
every operation computes shapes only, nothing is allocated and nothing is sent, yet
FSDP2, DTensor, autograd and AdamW run their real code. It returns what the step
would do on that rank: its collectives and bytes, its FLOPs and its peak memory by
category. `predict` is the closed-form model of the same quantities (and of step
time), written so that both can be held against each other and against published runs.
"""
import contextlib
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ['LLAMA3', 'H100', 'PUBLISHED', 'Llama', 'num_params', 'model_flops_per_token',
           'fake_step', 'predict', 'check_mfu', 'WIRE']

# Llama 3.1 shapes as torchtitan builds them (torchtitan/models/llama/__init__.py at commit
# 9dec370, the commit of its December 2024 benchmarks; the FFN width is torchtitan's rounding of
# ffn_dim_multiplier * 8/3 * dim up to multiple_of; the vocabulary is the Llama 3 tokenizer's).
LLAMA3 = {
    '8B': dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, hidden=14336, vocab=128256),
    '70B': dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, hidden=28672, vocab=128256),
    '405B': dict(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, hidden=53248, vocab=128256),
}

# H100 SXM: dense BF16 peak from NVIDIA's datasheet (the sparse figure is twice this), as
# torchtitan's get_peak_flops uses it; MAMF (the best matmul speed measured) from Stas Bekman's
# ml-engineering, compute/accelerator/README.md (794.5 of 989 TFLOPS); NVLink 900 GB/s both ways
# (NVIDIA's datasheet), 450 GB/s each way, within a host of 8; between hosts 400 Gb/s RDMA per GPU
# (torchtitan's benchmark hardware section).
H100 = dict(name='H100 SXM', peak=989e12, mamf=794.5e12, nvlink=450e9, network=50e9, gpus_per_host=8)

# torchtitan, benchmarks/llama3_h100_202412_torchtitan.md: Llama 3.1 on H100s, bf16 without
# Float8 or compile only (the rows this model can speak about), seq_len 8192 (the train configs
# at commit 9dec370). tps is tokens per second per GPU; memory is the reported peak in GiB.
PUBLISHED = [
    dict(source='torchtitan Table 1, FSDP', model='8B', gpus=8, tp=1, local_batch=2,
         ac='selective', tps=5762, memory_gib=82.4),
    dict(source='torchtitan Table 3, FSDP', model='8B', gpus=128, tp=1, local_batch=2,
         ac='selective', tps=5605, memory_gib=67.0),
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


def _block_params(cfg):
    d, kv = cfg['dim'], cfg['dim'] // cfg['n_heads'] * cfg['n_kv_heads']
    return 2 * d * d + 2 * d * kv + 3 * d * cfg['hidden'] + 2 * d  # wq wo, wk wv, w1 w2 w3, 2 norms


def num_params(cfg, n_layers=None):
    """Return (parameters of the blocks, of the rest: embedding, final norm and output)."""
    return (n_layers or cfg['n_layers']) * _block_params(cfg), 2 * cfg['vocab'] * cfg['dim'] + cfg['dim']


def model_flops_per_token(cfg, seq_len, n_layers=None):
    """Return the model FLOPs of one token's forward and backward: 6 per matmul weight plus attention.

    The PaLM appendix B convention torchtitan uses: the embedding does no matmul, causal masking
    is not subtracted, recomputation is not counted.
    """
    blocks, _ = num_params(cfg, n_layers)
    matmul_weights = blocks - 2 * (n_layers or cfg['n_layers']) * cfg['dim'] + cfg['vocab'] * cfg['dim']
    return 6 * matmul_weights + 12 * (n_layers or cfg['n_layers']) * cfg['dim'] * seq_len


# Bytes one rank sends per byte of the collective's input, n ranks, ring algorithms.
WIRE = {'all_gather_into_tensor': lambda n: n - 1, '_allgather_base_': lambda n: n - 1,
        'reduce_scatter_tensor': lambda n: (n - 1) / n, '_reduce_scatter_base_': lambda n: (n - 1) / n,
        'all_reduce': lambda n: 2 * (n - 1) / n, 'allreduce_': lambda n: 2 * (n - 1) / n}


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
    return FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward})


def _tensor_parallel(net, tp_mesh):
    """torchtitan's Llama plan: sequence-parallel norms, column/row-parallel matmuls, loss parallel."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    gather = lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    parallelize_module(net, tp_mesh, {
        'tok_embeddings': RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        'norm': SequenceParallel(),
        'output': ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)})
    for block in net.layers:
        parallelize_module(block, tp_mesh, {
            'attention_norm': SequenceParallel(), 'attention': gather(),
            'attention.wq': ColwiseParallel(), 'attention.wk': ColwiseParallel(),
            'attention.wv': ColwiseParallel(), 'attention.wo': RowwiseParallel(output_layouts=Shard(1)),
            'ffn_norm': SequenceParallel(), 'feed_forward': gather(),
            'feed_forward.w1': ColwiseParallel(), 'feed_forward.w3': ColwiseParallel(),
            'feed_forward.w2': RowwiseParallel(output_layouts=Shard(1))})


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
        raise RuntimeError('fake_step: a process group is already initialized; '
                           'call it in a process without one')
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
            with memory, flops, comm:
                step()
            peak = memory.get_tracker_snapshot('peak')[torch.device('cpu')]
        return dict(sent=dict(comm.sent), flops=flops.get_total_flops(),
                    calls={str(k).split('.')[-1]: v for k, v in comm.get_comm_counts().items()},
                    peak={str(k).split('.')[-1].lower(): v for k, v in peak.items()})
    finally:
        dist.destroy_process_group()


ACT_VALUES = {  # values one block keeps per token for backward, in units of (dim, kv width, hidden)
    # everything: norms (with fp32 copies), q, k, v, repeated k, v, attention, w1, w3, silu, product
    'none': (13.5, 2, 4),
    'full': (1, 0, 0),  # the block's input only: everything else is recomputed
    'selective': (4, 1, 1),  # input, q, attention output, w2 output; v; w1 output (every 2nd matmul)
}


def predict(cfg, gpus, local_batch, seq_len, ac='selective', tp=1, pp=1, microbatches=None,
            stages_per_rank=1, gpu=H100, efficiency=1.0):
    """Predict one rank's peak memory by category, bytes sent and step time under FSDP x tp.

    Memory (bytes) at the step's peak, the backward of the loss: fp32 parameters and AdamW's
    two moments, sharded over the gpus // tp FSDP ranks (blocks also over tp); the root's
    gathered bf16 embedding and output; each block's saved bf16 activations (ACT_VALUES); the
    loss head (12 bytes a logit and 10 a hidden value, as the fake run of this loss measures).
    Bytes: FSDP gathers bf16 block parameters twice (forward, backward), the root's once (it
    stays gathered after forward), and reduce-scatters fp32 gradients once.
    Time: FLOPs executed (recomputation included) at `efficiency` x MAMF, communication at the
    slowest link a collective crosses, hidden behind compute (FSDP prefetches). With pp > 1
    stages, a rank holds and computes 1/pp of the blocks, keeps the activations of up to pp
    micro-batches (1F1B), and a step lasts m + (pp - 1) / stages_per_rank micro-batch times
    instead of m (the bubble); `microbatches` m defaults to pp, as in torchtitan.
    """
    if ac not in ACT_VALUES:
        raise ValueError(f'predict: ac must be one of {sorted(ACT_VALUES)}, got {ac!r}')
    if gpus % (tp * pp):
        raise ValueError(f'predict: tp * pp = {tp * pp} must divide gpus={gpus}')
    m = microbatches or pp
    fsdp, layers, dim = gpus // (tp * pp), -(-cfg['n_layers'] // pp), cfg['dim']  # the largest stage
    blocks, rest = num_params(cfg, layers)  # (embedding and output counted on every stage: an upper bound)
    shard = (blocks / tp + rest / tp * (tp > 1) + rest * (tp == 1)) / fsdp  # parameters a rank keeps
    tokens = local_batch * seq_len / tp  # tokens whose activations a rank keeps (sequence parallel)
    kv = dim // cfg['n_heads'] * cfg['n_kv_heads']
    a, b, c = ACT_VALUES[ac]
    memory = dict(params=4 * shard, optimizer=8 * shard, gathered=2 * rest / tp * (fsdp > 1),
                  activations=2 * layers * tokens * min(m, pp) / m * (a * dim + b * kv + c * cfg['hidden']),
                  loss=local_batch * seq_len * (12 * cfg['vocab'] + 10 * dim) / tp)
    root = rest / (tp * fsdp) if tp > 1 else rest / fsdp
    sent = {'all-gather': 2 * (fsdp - 1) * (2 * shard - root),
            'reduce-scatter': 4 * shard * (fsdp - 1)}
    link = gpu['nvlink'] if gpus <= gpu['gpus_per_host'] else gpu['network']
    flops = model_flops_per_token(cfg, seq_len) * local_batch * seq_len / (tp * pp)
    redo = {'none': 0, 'selective': dim * (kv + dim + cfg['hidden']),  # wk, wo, w3: every 2nd matmul
            'full': blocks / layers - 2 * dim}[ac]  # every matmul of the block
    recompute = (2 * layers * redo + 2 * layers * dim * seq_len) * local_batch * seq_len / tp  # + flash's backward
    compute = (flops + recompute) / (efficiency * gpu['mamf'])
    comm = sum(sent.values()) / link
    step = max(compute, comm) * (m + (pp - 1) / stages_per_rank) / m  # the pipeline's bubble
    return dict(memory=memory, peak=sum(memory.values()), sent=sent, flops=flops,
                hardware_flops=flops + recompute, compute_s=compute, comm_s=comm, step_s=step,
                tps=local_batch * seq_len / (tp * pp) / step, mfu=flops / step / gpu['peak'])


def check_mfu(mfu, gpu=H100):
    """Refuse an MFU that no run can reach: above 1, or above the GPU's measured matmul ceiling."""
    if not 0 < mfu <= 1:
        raise ValueError(f'check_mfu: MFU {mfu:.1%} is impossible; is the peak the right GPU\'s '
                         'dense figure, and the FLOPs per token those of this model?')
    if mfu > gpu['mamf'] / gpu['peak']:
        raise ValueError(f'check_mfu: MFU {mfu:.1%} is above what the fastest matmul reaches on '
                         f'{gpu["name"]} ({gpu["mamf"] / gpu["peak"]:.1%} of peak): check the FLOPs and the peak')
    return mfu
