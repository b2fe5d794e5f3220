"""Planted bugs of notebook 11 (FSDP2), each tied to the check that must catch it."""

from verify.mutants.registry import Mutant

NB = '11_fsdp2'
TARGET = 'notebooks/11_fsdp2.ipynb'
# The script asserts each part's claims; the launch that runs the part fails when one does.
BASICS = "run = d2lpar.launch(work / 'fsdp_train.py'"
OPTIONS = "run = d2lpar.launch(work / 'fsdp_hsdp.py'"
SAVE = "run = d2lpar.launch(work / 'fsdp_save.py'"
RESUME = "run = d2lpar.launch(work / 'fsdp_resume.py'"

MUTANTS = [
    Mutant(
        'placements-2d-swapped',
        NB,
        'on the 2 x 2 mesh, [Replicate(), Shard(0)] splits the rows along shard and repeats them along replicate',
        TARGET,
        old="t = distribute_tensor(X, mesh2d, [Replicate(), Shard(0)])",
        new="t = distribute_tensor(X, mesh2d, [Shard(0), Replicate()])",
        catch=BASICS,
    ),
    Mutant(
        'avg-not-divided',
        NB,
        "gloo's ReduceOp.AVG is SUM / N",
        TARGET,
        old="dist.reduce_scatter_tensor(averaged, values.clone(), op=dist.ReduceOp.AVG)",
        new="dist.reduce_scatter_tensor(averaged, values.clone(), op=dist.ReduceOp.SUM)",
        catch=BASICS,
    ),
    Mutant(
        'fsdp-trains-on-the-whole-batch',
        NB,
        'FSDP2 trains like one process (each rank on its rows, gradients averaged)',
        TARGET,
        old="            X, y = X.chunk(n)[rank], y.chunk(n)[rank]",
        new="            X, y = X.chunk(n)[0], y.chunk(n)[0]",
        catch=BASICS,
        quick=True,
    ),
    Mutant(
        'shard-blocks-ignores-reshard',
        NB,
        'reshard_after_forward trades memory for communication',
        TARGET,
        old="        fully_shard(block, mesh=mesh, **kwargs)",
        new="        fully_shard(block, mesh=mesh, **{k: v for k, v in kwargs.items()\n"
        "                                         if k != 'reshard_after_forward'})",
        catch="assert res['True']['backward'] == res['2']['backward'] == 6 and res['False']['backward'] == 0",
    ),
    Mutant(
        'fsdp-reduce-in-bf16',
        NB,
        'gradients are reduce-scattered in float32',
        TARGET,
        old="param_dtype=torch.bfloat16, reduce_dtype=torch.float32)",
        new="param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)",
        catch=OPTIONS,
        quick=True,
    ),
    Mutant(
        'meta-init-never-filled',
        NB,
        'after to_empty, reset_parameters fills the shards with a Linear\'s initialisation',
        TARGET,
        old="+            module.reset_parameters()",
        new="+            pass  # forgot reset_parameters: to_empty's memory stays as it is",
        catch=OPTIONS,
    ),
    Mutant(
        'meta-init-ranks-draw-apart',
        NB,
        'on the CPU every rank draws the same numbers (no '
        'DTensor random-number tracker): each weight is one block repeated',
        TARGET,
        old="+            module.reset_parameters()",
        new="+            torch.manual_seed(rank), module.reset_parameters()",
        catch=OPTIONS,
    ),
    Mutant(
        'clip-at-another-threshold',
        NB,
        'clip_grad_norm_ on sharded gradients clips as one process does',
        TARGET,
        old="norms = train(net, torch.optim.SGD(net.parameters(), lr=0.5), data, clip=0.05)",
        new="norms = train(net, torch.optim.SGD(net.parameters(), lr=0.5), data, clip=0.1)",
        catch=OPTIONS,
    ),
    Mutant(
        'hsdp-on-the-flat-mesh',
        NB,
        'HSDP replicates across dim 0 and shards across dim 1',
        TARGET,
        old="+    fsdp_steps.shard_blocks(net, mesh2d, list(net))",
        new="+    fsdp_steps.shard_blocks(net, mesh, list(net))",
        catch=OPTIONS,
    ),
    Mutant(
        'no-explicit-forward-prefetch',
        NB,
        "explicit prefetch issues block i+1's all-gather before block i computes",
        TARGET,
        old="net[i].set_modules_to_forward_prefetch([net[i + 1]])",
        new="pass  # no forward prefetch",
        catch=SAVE,
    ),
    Mutant(
        'offload-run-loses-momentum',
        NB,
        'training with CPUOffloadPolicy equals one process (momentum, the state offload moves, included)',
        TARGET,
        old="+        opt = torch.optim.SGD(net.parameters(), **sgd)",
        new="+        opt = torch.optim.SGD(net.parameters(), lr=0.5)",
        catch=SAVE,
    ),
    Mutant(
        'selective-checkpoint-keeps-nothing',
        NB,
        'selective checkpointing holds less than none, more than full',
        TARGET,
        old="        return CheckpointPolicy.MUST_SAVE",
        new="        return CheckpointPolicy.PREFER_RECOMPUTE",
        catch="assert ac['none']['peak'] > ac['selective']['peak'] > ac['full']['peak']",
    ),
    Mutant(
        'resume-checkpoint-not-loaded',
        NB,
        'a 2-rank run resumes the 4-rank checkpoint',
        TARGET,
        old="dcp.load(state, checkpoint_id=args.folder)",
        new="pass  # forgot dcp.load: the new run keeps its own weights",
        catch=RESUME,
    ),
    Mutant(
        'resume-from-the-wrong-step',
        NB,
        'a 2-rank run resumes the 4-rank checkpoint',
        TARGET,
        old="train(net, opt, data[2:])  # step 3",
        new="train(net, opt, data[1:2])  # the step already taken",
        catch=RESUME,
    ),
    Mutant(
        name='blocks-never-wrapped',
        notebook=NB,
        claim='one FSDP unit per block: 6 all-gathers forward, 6 reduce-scatters, whatever the setting',
        target=TARGET,
        old='    for block in blocks:\n        fully_shard(block, mesh=mesh, **kwargs)\n',
        new='    pass  # the blocks not wrapped: the root is the only FSDP unit\n',
        catch="    assert res[setting]['forward'] == 6 and res[setting]['reduce_scatters'] == 6",
    ),
    Mutant(
        name='between-read-as-the-peak',
        notebook=NB,
        claim='reshard_after_forward=False holds every parameter whole between the passes (4P bytes more)',
        target=TARGET,
        old="forward, between = gathers(comm, 'allgather'), mem.settled_bytes()",
        new="forward, between = gathers(comm, 'allgather'), mem.peak",
        catch="assert res['False']['between'] - res['True']['between'] == 4 * P",
    ),
    Mutant(
        name='zero3-formula-keeps-whole-parameters',
        notebook=NB,
        claim="FSDP2's peak = the ZeRO-3 formula plus the layers in flight",
        target='d2lpar/lessons/nb10_zero.py',
        old="'zero3': (n, n, n)}",
        new="'zero3': (1, n, n)}",
        catch="assert zero3 <= res['True']['peak'] <= zero3 + (4 + 2) * layer_bytes",
    ),
    Mutant(
        name='zero3-formula-forgets-the-optimizer-state',
        notebook=NB,
        claim="FSDP2's peak = the ZeRO-3 formula plus the layers in flight",
        target='d2lpar/lessons/nb10_zero.py',
        old="return num_params * (bytes_param / p + bytes_grad / g + bytes_state / s)",
        new="return num_params * (bytes_param / p + bytes_grad / g)",
        catch="assert zero3 <= res['True']['peak'] <= zero3 + (4 + 2) * layer_bytes",
    ),
    Mutant(
        name='hand-zero3-keeps-gathered-parameters',
        notebook=NB,
        claim="FSDP2 with True holds just what hand ZeRO-3 holds between the passes",
        target='d2lpar/lessons/nb10_zero.py',
        old='                layer.register_forward_hook(lambda m, args, out: self.free(m))\n',
        new='',
        catch="assert res['True']['between'] == res['hand ZeRO-3']['between']",
    ),
    Mutant(
        name='selective-keeps-the-gelus-not-the-products',
        notebook=NB,
        claim='selective checkpointing reruns no matrix product',
        target=TARGET,
        old='    if op in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default):\n',
        new='    if op in (torch.ops.aten.gelu.default,):\n',
        catch="assert ac['none']['ops']['addmm'] == ac['selective']['ops']['addmm'] == 12",
    ),
    Mutant(
        name='full-checkpoint-skips-the-last-block',
        notebook=NB,
        claim="full checkpointing reruns every block's forward (twice the products)",
        target=TARGET,
        old='    return nn.Sequential(*map(wrap, net))',
        new='    return nn.Sequential(*map(wrap, net[:-1]), net[-1])',
        catch="assert ac['full']['ops']['addmm'] == 24 and ac['selective']['ops']['gelu'] > 12",
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = [
    # torch's own rule, for this model (the root holds no parameters): None acts as True on every
    # block; shard_blocks passes the setting to the blocks only, so no bug of the course's reaches it.
    "assert all(res['None'][k] == res['True'][k] for k in same), {k: (res['None'][k], res['True'][k]) for k in same}",
    # reshard_after_forward=2 (an int: a copy sharded over 2 ranks) is torch's; a bug that changes
    # what the script measures fails the False check just before it first.
    "assert res['2']['between'] - res['True']['between'] == 4 * P / 2",
    # checkpointing changes no gradient: torch's; every bug of the wrappers tried changes the
    # products counted first.
    "assert all(torch.allclose(a, b) for a, b in zip(ac[mode]['grads'], ac['none']['grads']))",
]
