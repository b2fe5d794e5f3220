"""Planted bugs of notebook 12 (tensor and sequence parallelism by hand) and the checks that catch them."""

from verify.mutants.registry import Mutant

NB = '12_tensor_parallel'
TARGET = 'notebooks/12_tensor_parallel.ipynb'
EQUAL = "assert worst < 1e-5 and calls == {'all_reduce': 4}, (rank, r['megatron'])"
SP_EQUAL = "assert worst < 1e-5 and calls == {'all_gather': 4, 'reduce_scatter': 4, 'all_reduce': 6}, r['sp']"

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
        catch=SP_EQUAL,
    ),
    Mutant(
        name='sp-gather-backward-keeps-own-block',
        notebook=NB,
        claim='sequence parallelism = one process (the gradient of an all-gather is a reduce-scatter)',
        target=TARGET,
        old='    def backward(ctx, grad):\n        return reduce_scatter_tokens(grad)',
        new='    def backward(ctx, grad):\n        return grad.chunk(dist.get_world_size(), dim=1)[dist.get_rank()]',
        catch=SP_EQUAL,
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
        name='mlp-bias-blocks-swapped',
        notebook=NB,
        claim="the column-parallel blocks side by side are the unsplit layer's output",
        target=TARGET,
        old='zip(W1.chunk(n, dim=0), b1.chunk(n))]',
        new='zip(W1.chunk(n, dim=0), b1.chunk(n)[::-1])]',
        catch='torch.testing.assert_close(torch.cat(hidden, dim=1), torch.relu(mlp[0](X)))',
    ),
    Mutant(
        name='overlap-sync-never-waits',
        notebook=NB,
        claim='the synchronous backward waits for the sum before the matmul',
        target=TARGET,
        old='        if not ctx.overlap:\n            work.wait()  # the synchronous version',
        new='        if False:\n            work.wait()  # the synchronous version',
        catch="assert all(not ev['in_flight'] and ev['arrived'] <= ev['computing'] for ev in sync)",
    ),
    Mutant(
        name='sp-bytes-gather-counted-twice',
        notebook=NB,
        claim='sequence parallelism sends the same ring bytes as the all-reduces',
        target=TARGET,
        old="'all_gather': lambda n: n - 1,  # its input block goes to the n - 1 others",
        new="'all_gather': lambda n: 2 * (n - 1),  # its input block goes to the n - 1 others",
        catch="assert sent(r['sp']['calls'], ('all_gather', 'reduce_scatter')) == sent(r['megatron']['calls'], ('all_reduce',))",
    ),
    Mutant(
        name='sp-partial-read-after-the-sum',
        notebook=NB,
        claim="a norm's gradient before sum_replicated_grads is far from the true one",
        target=TARGET,
        old='+    partial = sp.norm1.weight.grad.clone()\n+    tp.sum_replicated_grads(sp)\n',
        new='+    tp.sum_replicated_grads(sp)\n+    partial = sp.norm1.weight.grad.clone()\n',
        catch="assert r['sp']['partial'] > 0.1  # before sum_replicated_grads",
    ),
    Mutant(
        name='row-blocks-paired-with-the-wrong-hidden-block',
        notebook=NB,
        claim="the row-parallel blocks' partial outputs, summed with the bias once, are the unsplit MLP's",
        target=TARGET,
        old='partials = [H @ W.T for H, W in zip(hidden, W2.chunk(n, dim=1))]',
        new='partials = [H @ W.T for H, W in zip(hidden, W2.chunk(n, dim=1)[::-1])]',
        catch='torch.testing.assert_close(sum(partials) + b2, mlp(X))',
    ),
    Mutant(
        name='heads-read-another-ranks-values',
        notebook=NB,
        claim="heads split over ranks, partial outputs summed, are the unsplit attention",
        target=TARGET,
        old='zip(q.chunk(n, -1), k.chunk(n, -1), v.chunk(n, -1))]',
        new='zip(q.chunk(n, -1), k.chunk(n, -1), v.chunk(n, -1)[::-1])]',
        catch='torch.testing.assert_close(sum(partials) + attention.out.bias, attention(tokens))',
    ),
    Mutant(
        name='overlap-reduces-a-copy',
        notebook=NB,
        claim="overlapped, f's backward returns the same sum as the synchronous one",
        target=TARGET,
        old='        work = dist.all_reduce(grad_X, async_op=True)  # sum the terms; returns at once\n',
        new='        work = dist.all_reduce(grad_X.clone() if ctx.overlap else grad_X, async_op=True)\n',
        catch="assert r['overlap_equal']  # torch.equal on every gradient",
    ),
    Mutant(
        name='column-blocks-indexed-as-on-two-ranks',
        notebook=NB,
        claim="Megatron's block = one process on 4 ranks too (a split right only on two)",
        target=TARGET,
        old='        self.weight = nn.Parameter(linear.weight.detach().chunk(n, dim=0)[rank].clone())\n'
        '        self.bias = nn.Parameter(linear.bias.detach().chunk(n)[rank].clone())\n',
        new='        self.weight = nn.Parameter(linear.weight.detach().chunk(n, dim=0)[rank % 2].clone())\n'
        '        self.bias = nn.Parameter(linear.bias.detach().chunk(n)[rank % 2].clone())\n',
        catch="assert max(r['megatron'][k] for k in ('out', 'x_grad', 'grads')) < 1e-5  # Megatron, on 4 ranks too",
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = []
