"""Planted bugs of notebook 12 (tensor and sequence parallelism) and the checks that catch them."""

from verify.mutants.registry import Mutant

NB = '12_tensor_parallel'
TARGET = 'notebooks/12_tensor_parallel.ipynb'
EQUAL = "assert max(r[name]['out'], r[name]['x_grad'], r[name]['grads']) < 1e-5"

MUTANTS = [
    Mutant(
        name='attention-scale-wrong',
        notebook=NB,
        quick=True,
        claim='attend is scaled dot-product attention',
        target=TARGET,
        old='/ head_dim ** 0.5, dim=-1)',
        new='/ head_dim, dim=-1)',
        catch='torch.testing.assert_close(attend(q, k, v, 4), torch_attention',
    ),
    Mutant(
        name='f-backward-without-allreduce',
        notebook=NB,
        claim="Megatron's block = one process (f sums the input's gradient)",
        target=TARGET,
        old='        grad = grad.clone()  # autograd may hand the same tensor to others: reduce a copy\n'
        '        dist.all_reduce(grad)\n',
        new='        grad = grad.clone()  # autograd may hand the same tensor to others: reduce a copy\n',
        catch=EQUAL,
    ),
    Mutant(
        name='g-forward-without-allreduce',
        notebook=NB,
        claim="Megatron's block = one process (g sums the partial products)",
        target=TARGET,
        old='        X = X.clone()  # all_reduce works in place; the caller\'s tensor stays this rank\'s own\n'
        '        dist.all_reduce(X)\n',
        new='        X = X.clone()  # all_reduce works in place; the caller\'s tensor stays this rank\'s own\n',
        catch=EQUAL,
    ),
    Mutant(
        name='row-parallel-bias-on-every-rank',
        notebook=NB,
        claim="Megatron's block = one process (the bias added once, after the sum)",
        target=TARGET,
        old='return self.leave(F.linear(X, self.weight)) + self.bias',
        new='return self.leave(F.linear(X, self.weight, self.bias))',
        catch=EQUAL,
    ),
    Mutant(
        name='sp-replicated-grads-not-summed',
        notebook=NB,
        claim='sequence parallelism = one process (replicated gradients summed over the group)',
        target=TARGET,
        old='              block.attention.out.bias, block.mlp.fc2.bias):\n        dist.all_reduce(p.grad)',
        new='              block.attention.out.bias, block.mlp.fc2.bias):\n        pass',
        catch=EQUAL,
    ),
    Mutant(
        name='sp-gather-backward-keeps-own-block',
        notebook=NB,
        claim='sequence parallelism = one process (the gradient of an all-gather is a reduce-scatter)',
        target=TARGET,
        old='    def backward(ctx, grad):\n        return reduce_scatter_tokens(grad)',
        new='    def backward(ctx, grad):\n        return grad.chunk(dist.get_world_size(), dim=1)[dist.get_rank()]',
        catch=EQUAL,
    ),
    Mutant(
        name='overlap-allreduce-blocking',
        notebook=NB,
        claim="f's all-reduce overlaps the weight-gradient matmul",
        target=TARGET,
        old='work = dist.all_reduce(grad_X, async_op=True)  # sum the terms; returns at once',
        new='work = dist.all_reduce(grad_X, async_op=True)  # sum the terms; returns at once\n        work.wait()',
        catch="assert any(ev['in_flight'] and ev['computing'] < ev['arrived'] and ev['done_meanwhile']",
    ),
    Mutant(
        name='overlap-stamped-after-wait',
        notebook=NB,
        claim="f's all-reduce overlaps the weight-gradient matmul (stamped where it ends)",
        target=TARGET,
        old="            work.get_future().then(lambda _: ev.setdefault('arrived', time.perf_counter()))\n"
        "        if not ctx.overlap:\n"
        "            work.wait()  # the synchronous version: wait before computing anything else\n",
        new="            work.get_future().then(lambda _: ev.setdefault('arrived', time.perf_counter()))\n"
        "        work.wait()\n"
        "        if not ctx.overlap:\n"
        "            work.wait()  # the synchronous version: wait before computing anything else\n",
        catch="assert any(ev['in_flight'] and ev['computing'] < ev['arrived'] and ev['done_meanwhile']",
    ),
    Mutant(
        name='saved-bytes-counts-parameters',
        notebook=NB,
        claim='activations per rank = the count by hand',
        target=TARGET,
        old='        if ptr not in skip:\n            storages[ptr]',
        new='        if True:\n            storages[ptr]',
        catch="assert all(report[rank]['saved'] == by_hand for rank in report)",
    ),
    Mutant(
        name='loss-parallel-off-logits-gathered',
        notebook=NB,
        claim='loss_parallel never gathers the logits',
        target=TARGET,
        old='with loss_parallel():\n    with CommDebugMode() as comm:',
        new='with torch.enable_grad():\n    with CommDebugMode() as comm:',
        catch="assert set(dt[0]['loss_parallel']['collectives']) == {'all_reduce'}",
    ),
    Mutant(
        name='block-bytes-tp-three-allreduces',
        notebook=NB,
        claim='bytes counted per strategy = block_bytes',
        target=TARGET,
        old="'TP': 4 * 2 * ring * activation",
        new="'TP': 3 * 2 * ring * activation",
        catch='assert max(sent) == round(want), (nproc, name, sent, want)',
    ),
    Mutant(
        name='wire-bytes-counted-in-floats',
        notebook=NB,
        claim='gloo writes at least the bytes of the ring formula',
        target=TARGET,
        old="report['wrote'][name] = None if before is None else written() - before",
        new="report['wrote'][name] = None if before is None else (written() - before) // 4",
        catch='assert wrote == 0 or wrote >= want, (nproc, name, wrote, want)',
    ),
    Mutant(
        name='tp-stall-with-a-peak-of-no-gpu',
        notebook=NB,
        claim='TP stalls about a tenth of the compute on NVLink (H100)',
        target=TARGET,
        old='peak = 989e12  # H100 SXM, dense bf16',
        new='peak = 400e12  # H100 SXM, dense bf16',
        catch="assert 0.05 * compute < tp_stall['NVLink'] < 0.15 * compute",
    ),
]
