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
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = [
    "assert dt[0]['tp']['collectives'] == {'all_reduce': 6}",
    "assert dt[0]['sp']['collectives'] == {'all_gather_into_tensor': 4, 'reduce_scatter_tensor': 4}",
    "assert dt[0]['sp']['norm_grad'] == '(Partial(sum),)'",
    "assert abs(lp['loss'] - lp['want']) < 1e-5 and lp['grads'] < 1e-5 and lp['local'] == [4, 8, 64 // 2], lp",
    "assert t['NVLink']['DP'] < backward < t['Ethernet']['DP']",
    "assert t['NVLink']['FSDP'] / 3 < forward and 2 * t['NVLink']['FSDP'] / 3 < backward < 2 * t['Ethernet']['FSDP'] / 3",
    "assert t['NVLink']['TP'] / 2 < window",
    "assert t['Ethernet']['PP'] / 2 / 8 < stage_forward",
]
