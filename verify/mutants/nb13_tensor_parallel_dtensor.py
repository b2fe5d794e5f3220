"""Planted bugs of notebook 13 (tensor parallelism with DTensor, costs, MFU) and the checks that catch them."""

from verify.mutants.registry import Mutant

NB = '13_tensor_parallel_dtensor'
TARGET = 'notebooks/13_tensor_parallel_dtensor.ipynb'

MUTANTS = [
    Mutant(
        name='dtensor-partial-grad-not-summed',
        notebook=NB,
        quick=True,
        claim='SequenceParallel = sequence parallelism by hand (a Partial gradient is summed)',
        target=TARGET,
        old='local = lambda p: (p.grad.redistribute(p.device_mesh, p.placements).to_local()',
        new='local = lambda p: (p.grad.to_local()',
        catch="assert r['tp']['diff'] < 1e-5 and r['sp']['diff'] < 1e-5, r",
    ),
    Mutant(
        name='loss-parallel-off-logits-gathered',
        notebook=NB,
        claim='loss_parallel never gathers the logits',
        target=TARGET,
        old='+with loss_parallel():\n+    with CommDebugMode() as comm:',
        new='+with torch.enable_grad():\n+    with CommDebugMode() as comm:',
        catch="assert set(lp['collectives']) == {'all_reduce'}, lp['collectives']",
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
    Mutant(
        name='mfu-peak-counts-too-few-flops',
        notebook=NB,
        claim='MFU is a fraction of the measured peak',
        target=TARGET,
        old="report['peak'] = 2 * 512 ** 3 * 10 /",
        new="report['peak'] = 2 * 512 ** 2 * 10 /",
        catch='assert all(0 < v < 1 for v in mfu.values())',
    ),
    Mutant(
        name='dtensor-backward-not-counted',
        notebook=NB,
        claim="DTensor's Megatron plan runs f's and g's six all-reduces, forward and backward",
        target=TARGET,
        old='        out = block(X, keep)\n        (out * weights).sum().backward()\n',
        new='        out = block(X, keep)\n    (out * weights).sum().backward()\n',
        catch="assert dt[0]['tp']['collectives'] == {'all_reduce': 6}",
    ),
    Mutant(
        name='sp-gathers-once-per-projection',
        notebook=NB,
        claim='sequence parallelism gathers the tokens once per attention, not once per projection',
        target=TARGET,
        old="'attention': gather, 'mlp': gather,",
        new="'mlp': gather, **{f'attention.{p}': ColwiseParallel(input_layouts=Shard(1)) for p in 'qkv'},",
        catch="assert dt[0]['sp']['collectives'] == {'all_gather_into_tensor': 4, 'reduce_scatter_tensor': 4}",
    ),
    Mutant(
        name='norm-placements-of-the-weight-not-its-gradient',
        notebook=NB,
        claim="a sequence-parallel norm's gradient is a Partial sum, summed when it is used",
        target=TARGET,
        old="collectives=sp['collectives'],\n                    norm_grad=str(sp_block.norm1.weight.grad.placements))",
        new="collectives=sp['collectives'],\n                    norm_grad=str(sp_block.norm1.weight.placements))",
        catch="assert dt[0]['sp']['norm_grad'] == '(Partial(sum),)'",
    ),
    Mutant(
        name='loss-parallel-norm-not-sequence-parallel',
        notebook=NB,
        claim="loss_parallel's loss and gradients = one process's",
        target=TARGET,
        old="+lm_plan.update({'norm': SequenceParallel(),\n+                'head':",
        new="+lm_plan.update({\n+                'head':",
        catch="assert abs(lp['loss'] - lp['want']) < 1e-5 and lp['grads'] < 1e-5",
    ),
    Mutant(
        name='ethernet-in-bits-per-second',
        notebook=NB,
        claim="DP's all-reduce hides behind backward on NVLink, not over Ethernet",
        target=TARGET,
        old="links = {'NVLink': 450e9, 'Ethernet': 12.5e9}",
        new="links = {'NVLink': 450e9, 'Ethernet': 100e9}",
        catch="assert t['NVLink']['DP'] < backward < t['Ethernet']['DP']",
    ),
    Mutant(
        name='tp-window-of-q-k-v-only',
        notebook=NB,
        claim="TP's backward all-reduce hides behind the column-parallel weight gradients",
        target=TARGET,
        old='window = 2 * 7 * D_big ** 2 * tokens',
        new='window = 2 * 3 * D_big ** 2 * tokens',
        catch="assert t['NVLink']['TP'] / 2 < window",
    ),
    Mutant(
        name='pp-stage-compute-split-over-ranks',
        notebook=NB,
        claim='a pipeline stage computes much longer than its one send takes',
        target=TARGET,
        old='stage_forward = 8 * flop / (0.5 * peak) / 3 / 8',
        new='stage_forward = flop / n_big / (0.5 * peak) / 3 / 8',
        catch="assert t['Ethernet']['PP'] / 2 / 8 < stage_forward",
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = []
