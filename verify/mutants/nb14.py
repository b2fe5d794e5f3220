"""Planted bugs of notebook 14 (context and expert parallelism), each tied to its check."""
from verify.mutants.registry import Mutant

NB = '14_context_expert'
TARGET = 'notebooks/14_context_expert.ipynb'
LAUNCH = "run = d2lpar.launch(work / 'context_expert.py'"  # every rank checks against one process

MUTANTS = [
    Mutant('merge-ignores-the-mass', NB, 'partial attention results merge exactly by their lse',
           TARGET, old="torch.exp(lse2 - lse) * O2, lse", new="torch.exp(lse1 - lse) * O2, lse",
           catch="torch.testing.assert_close(O, full)", quick=True),
    Mutant('all-to-all-cost-doubled', NB, 'all-to-all: half the bandwidth term of a ring allreduce',
           TARGET, old="return (n - 1) * latency + (n - 1) / n * size / bandwidth",
           new="return (n - 1) * latency + 2 * (n - 1) / n * size / bandwidth",
           catch="assert math.isclose(all_to_all_cost(n, S, B)"),
    Mutant('gates-not-renormalised', NB, "a token's k gates add up to one", TARGET,
           old="gate = top / top.sum(dim=-1, keepdim=True)", new="gate = top",
           catch="assert torch.allclose(torch.zeros(5).index_add(0, token, gate), torch.ones(5))"),
    Mutant('balancing-loss-without-E', NB, 'the balancing loss is 1 when uniform, E when collapsed',
           TARGET, old="return num_experts * (share * probs.mean(dim=0)).sum()",
           new="return (share * probs.mean(dim=0)).sum()",
           catch="assert math.isclose(load_balancing_loss(uniform, k=1).item(), 1, rel_tol=1e-6)"),
    Mutant('capacity-off-by-one', NB, 'an expert keeps its first `capacity` assignments', TARGET,
           old="keep = place <= capacity", new="keep = place < capacity",
           catch="assert all(a >= b for a, b in zip(dropped, dropped[1:])) and dropped[-1] == 0"),
    Mutant('zigzag-split-unbalanced', NB, 'the zig-zag split gives every rank the same work',
           TARGET, old="return [[r, 2 * n - 1 - r] if zigzag else [r] for r in range(n)]",
           new="return [[r, n + r] if zigzag else [r] for r in range(n)]",
           catch="assert len(set(scores[True])) == 1"),
    Mutant('causal-mask-off-by-a-chunk', NB, 'ring attention equals full causal attention', TARGET,
           old="if not causal or j < i:", new="if not causal or j <= i:", catch=LAUNCH),
    Mutant('ring-holds-the-wrong-block', NB, 'ring attention equals full causal attention', TARGET,
           old="src = (rank - step) % n  # whose keys and values we hold now",
           new="src = (rank + step) % n  # whose keys and values we hold now", catch=LAUNCH),
    Mutant('ring-backward-dk-unscaled', NB, "ring attention's gradients equal full attention's",
           TARGET, old="dKV[0][..., cols, :] += dS.transpose(-2, -1) @ q * scale",
           new="dKV[0][..., cols, :] += dS.transpose(-2, -1) @ q", catch=LAUNCH),
    Mutant('token-to-the-wrong-expert', NB, 'expert parallelism equals the MoE in one process',
           TARGET, old="which = torch.arange(local, device=X.device).repeat(n).repeat_interleave(received)",
           new="which = torch.arange(local, device=X.device).repeat_interleave(n).repeat_interleave(received)",
           catch=LAUNCH),
    Mutant('ring-bytes-without-homecoming', NB, 'ring attention sends 2(n-1)b + 4(n-1)b + 2b',
           TARGET, old="backward = (n - 1) * 4 * block_bytes + 2 * block_bytes",
           new="backward = (n - 1) * 4 * block_bytes",
           catch="assert ring['traffic']['sent'] == sum(ring_attention_bytes(n, ring['block_bytes']))"),
]
