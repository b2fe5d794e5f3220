"""Planted bugs of notebook 11 (FSDP2), each tied to the check that must catch it."""
from verify.mutants.registry import Mutant

NB = '11_fsdp2'
TARGET = 'notebooks/11_fsdp2.ipynb'
LAUNCH = "run = d2lpar.launch(work / 'train_fsdp2.py'"  # the script asserts parity and AVG
RESUME = "resumed = d2lpar.launch(work / 'resume_fsdp2.py'"

MUTANTS = [
    Mutant('fsdp-reduce-in-bf16', NB, 'gradients are reduce-scattered in float32', TARGET,
           old="param_dtype=torch.bfloat16, reduce_dtype=torch.float32)",
           new="param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)",
           catch="assert mixed == dict(forward='torch.bfloat16'", quick=True),
    Mutant('avg-not-divided', NB, "gloo's ReduceOp.AVG is SUM / N", TARGET,
           old="dist.reduce_scatter_tensor(averaged, values.clone(), op=dist.ReduceOp.AVG)",
           new="dist.reduce_scatter_tensor(averaged, values.clone(), op=dist.ReduceOp.SUM)",
           catch=LAUNCH),
    Mutant('shard-blocks-ignores-reshard', NB, 'reshard_after_forward trades memory for '
           'communication', TARGET, old="        fully_shard(block, mesh=mesh, **kwargs)",
           new="        fully_shard(block, mesh=mesh, **{k: v for k, v in kwargs.items()\n"
               "                                         if k != 'reshard_after_forward'})",
           catch="assert res[setting]['forward_gathers'] == 6 and res[setting]['reduce_scatters'] == 6"),
    # On the sharded state the foreach copy is 1/N of the second moments, inside the window at
    # this size (a mutant on part 3's FSDP2 AdamW survives); DDP's full copy is not.
    Mutant('hand-stages-adamw-foreach', NB, "each stage's peak lies a few layers above its "
           "formula (AdamW's default on GPUs)", TARGET,
           old="dict(lr=0.01, foreach=False))", new="dict(lr=0.01, foreach=True))",
           catch="assert formula <= r['peak'] <= formula + 5 * layer_bytes, name"),
    Mutant('hsdp-on-the-flat-mesh', NB, 'HSDP replicates across dim 0 and shards across dim 1',
           TARGET, old="    fsdp_steps.shard_blocks(net, mesh2d, list(net))",
           new="    fsdp_steps.shard_blocks(net, mesh, list(net))",
           catch="assert r0['hsdp']['placements'] == '(Replicate(), Shard(dim=0))'"),
    Mutant('no-explicit-forward-prefetch', NB, 'explicit prefetch issues block i+1\'s all-gather '
           'before block i computes', TARGET,
           old="            net[i].set_modules_to_forward_prefetch([net[i + 1]])\n", new="",
           catch="assert all(early) if explicit == 'True' else not any(early)"),
    Mutant('selective-checkpoint-keeps-nothing', NB, 'selective checkpointing reruns no matrix '
           'product', TARGET, old="        return CheckpointPolicy.MUST_SAVE",
           new="        return CheckpointPolicy.PREFER_RECOMPUTE",
           catch="assert ac['none']['ops']['addmm'] == ac['selective']['ops']['addmm'] == 12"),
    Mutant('resume-checkpoint-not-loaded', NB, 'a 2-rank run resumes the 4-rank checkpoint', TARGET,
           old="dcp.load(state, checkpoint_id=args.folder)\n",
           new="pass  # forgot dcp.load: the new run keeps its own weights\n", catch=RESUME),
    Mutant('resume-from-the-wrong-step', NB, 'a 2-rank run resumes the 4-rank checkpoint', TARGET,
           old="X, y = data[2]\n", new="X, y = data[1]  # the batch of the step already taken\n",
           catch=RESUME),
]
