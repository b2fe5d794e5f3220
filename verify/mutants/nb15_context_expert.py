"""Planted bugs of notebook 15 (context and expert parallelism), each tied to its check."""

from verify.mutants.registry import Mutant

NB = '15_context_expert'
TARGET = 'notebooks/15_context_expert.ipynb'
RING = "run = d2lpar.launch(work / 'ring_attention.py'"  # every rank checks against one process
EXPERTS = "run = d2lpar.launch(work / 'expert_parallel.py'"  # the same, for all-to-all and the MoE
SCRIPT = 'notebooks/scripts/context_parallel_torch.py'

MUTANTS = [
    Mutant(
        'merge-ignores-the-mass',
        NB,
        'partial attention results merge exactly by their lse',
        TARGET,
        old="torch.exp(lse2 - lse) * O2, lse",
        new="torch.exp(lse1 - lse) * O2, lse",
        catch="torch.testing.assert_close(O, full)",
        quick=True,
    ),
    Mutant(
        'all-to-all-cost-doubled',
        NB,
        'all-to-all: half the bandwidth term of a ring allreduce',
        TARGET,
        old="return (n - 1) * latency + (n - 1) / n * size / bandwidth",
        new="return (n - 1) * latency + 2 * (n - 1) / n * size / bandwidth",
        catch="assert a2a['sent'] == all_to_all_cost(n, a2a['size'], bandwidth=1)",
    ),
    Mutant(
        'gates-not-renormalised',
        NB,
        "a token's k gates add up to one",
        TARGET,
        old="gate = top / top.sum(dim=-1, keepdim=True)",
        new="gate = top",
        catch="assert torch.allclose(torch.zeros(5).index_add(0, token, gate), torch.ones(5))",
    ),
    Mutant(
        'balancing-loss-without-E',
        NB,
        'the balancing loss is 1 when uniform, E when collapsed',
        TARGET,
        old="return num_experts * (share * probs.mean(dim=0)).sum()",
        new="return (share * probs.mean(dim=0)).sum()",
        catch="assert math.isclose(load_balancing_loss(uniform, k=1).item(), 1, rel_tol=1e-6)",
    ),
    Mutant(
        'capacity-off-by-one',
        NB,
        'an expert keeps its first `capacity` assignments',
        TARGET,
        old="keep = place <= capacity",
        new="keep = place < capacity",
        catch="assert all(a >= b for a, b in zip(dropped, dropped[1:])) and dropped[-1] == 0",
    ),
    Mutant(
        'zigzag-split-unbalanced',
        NB,
        'the zig-zag split gives every rank the same work',
        TARGET,
        old="return [[r, 2 * n - 1 - r] if zigzag else [r] for r in range(n)]",
        new="return [[r, n + r] if zigzag else [r] for r in range(n)]",
        catch="assert len(set(scores[True])) == 1",
    ),
    Mutant(
        'causal-mask-off-by-a-chunk',
        NB,
        'ring attention equals full causal attention',
        TARGET,
        old="if not causal or j < i:",
        new="if not causal or j <= i:",
        catch=RING,
    ),
    Mutant(
        'ring-holds-the-wrong-block',
        NB,
        'ring attention equals full causal attention',
        TARGET,
        old="src = (rank - step) % n  # whose keys and values we hold now",
        new="src = (rank + step) % n  # whose keys and values we hold now",
        catch=RING,
    ),
    Mutant(
        'ring-backward-dk-unscaled',
        NB,
        "ring attention's gradients equal full attention's",
        TARGET,
        old="dKV[0][..., cols, :] += dS.transpose(-2, -1) @ q * scale",
        new="dKV[0][..., cols, :] += dS.transpose(-2, -1) @ q",
        catch=RING,
    ),
    Mutant(
        'token-to-the-wrong-expert',
        NB,
        'expert parallelism equals the MoE in one process',
        TARGET,
        old="which = torch.arange(local, device=X.device).repeat(n).repeat_interleave(received)",
        new="which = torch.arange(local, device=X.device).repeat_interleave(n).repeat_interleave(received)",
        catch=EXPERTS,
    ),
    Mutant(
        'ring-bytes-without-homecoming',
        NB,
        'ring attention sends 2(n-1)b + 4(n-1)b + 2b',
        TARGET,
        old="backward = (n - 1) * 4 * block_bytes + 2 * block_bytes",
        new="backward = (n - 1) * 4 * block_bytes",
        catch="assert ring['traffic']['sent'] == sum(ring_attention_bytes(n, ring['block_bytes']))",
    ),
    Mutant(
        'moe-bytes-without-counts',
        NB,
        "expert parallelism sends the counts, then the rows",
        TARGET,
        old="return (n - 1) * local * 8 + 2 * rows * dim * itemsize",
        new="return 2 * rows * dim * itemsize",
        catch="assert m['traffic']['sent'] == moe_bytes(",
    ),
    Mutant(
        'balancing-loss-without-gradient',
        NB,
        'the balancing loss keeps the router even',
        TARGET,
        old="return num_experts * (share * probs.mean(dim=0)).sum()",
        new="return num_experts * (share * probs.mean(dim=0).detach()).sum()",
        catch="assert runs[0.0][0][-1] > 2.5 and runs[0.01][0][-1] < 1.6",
    ),
    Mutant(
        'ring-rank-holds-the-whole-sequence',
        NB,
        "a ring rank's peak is under 1/n of one process's and grows about linearly",
        TARGET,
        old="ring = peak(lambda: ring_step(Q, K, V, G))",
        new="ring = peak(lambda: full_attention(Q, K, V, G))",
        catch="assert ring < full / n",
    ),
    Mutant(
        'context-parallel-forgotten',
        NB,
        "torch's context_parallel: a ring on GPUs, none on CPU",
        SCRIPT,
        old="    with context_parallel(mesh, buffers=[Q, K, V, G], buffer_seq_dims=[2, 2, 2, 2]):",
        new="    with torch.autograd.set_grad_enabled(True):",
        catch="run = d2lpar.launch('scripts/context_parallel_torch.py'",  # the script fails: no ring at all
    ),
    Mutant(
        'balancing-loss-softmax-twice',
        NB,
        'the balancing loss is E when one expert takes everything',
        TARGET,
        old="return num_experts * (share * probs.mean(dim=0)).sum()",
        new="return num_experts * (share * probs.softmax(dim=-1).mean(dim=0)).sum()",
        catch="assert load_balancing_loss(collapsed, k=1).item() == E",
    ),
    Mutant(
        'ring-gradients-in-two-messages',
        NB,
        'ring attention sends K, V (and dK, dV) as one message per step',
        TARGET,
        old=(
            "            dKV, done = pass_on(dKV, group)\n"
            "            for request in done + (requests if step < n - 1 else []):\n"
            "                request.wait()\n"
        ),
        new=(
            "            (dK, d1), (dV, d2) = pass_on(dKV[0], group), pass_on(dKV[1], group)\n"
            "            for request in d1 + d2 + (requests if step < n - 1 else []):\n"
            "                request.wait()\n"
            "            dKV = torch.stack([dK, dV])\n"
        ),
        catch="assert ring['traffic']['messages'] == (n - 1) + (n - 1) + n",
    ),
    Mutant(
        'notebook-assumes-nccl',
        NB,
        "the notebook expects the backend the script ran on, and context_parallel exactly where torch has it",
        TARGET,
        old="backend = pick_backend(2)  # nccl with a GPU per process, else gloo",
        new="backend = 'nccl'  # nccl with a GPU per process, else gloo",
        catch="assert report['backend'] == backend and report['supported'] == (backend == 'nccl')",
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = [
    # At the small workload's lengths (256-1024) a ring rank whose memory grows as S^2 fails
    # `ring < full / n` first whenever it fails this; at the full lengths (512-8192) a rank that keeps
    # the whole S x S mask fails only this check, so it stays.
    "assert growth_full > 3.5 and growth_ring < 3",
]
