"""Planted bugs for notebook 2, CUDA_VISIBLE_DEVICES."""

from verify.mutants.registry import Mutant

NB = '02_visible_devices'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant(
        'mask-set-after-import',
        NB,
        'variables set before import torch take effect',
        FILE,
        old="EARLY = 'import os\\n' + SET + 'import torch\\n'",
        new="EARLY = 'import os\\nimport torch\\n' + SET",
        catch="assert threads[0] == 1",
        quick=True,
    ),
    Mutant(
        'duplicate-ordinal-kept',
        NB,
        'an entry listed twice empties the mask',
        'd2lpar/visibility.py',
        old='        if x in ordinals:\n            return []\n',
        new='',
        catch='assert mask not in expected_on_4 or on4 == expected_on_4[mask]',
    ),
    Mutant(
        'invalid-entry-skipped',
        NB,
        'parsing stops at the first invalid entry',
        'd2lpar/visibility.py',
        old='        if x < 0:\n            break\n',
        new='        if x < 0:\n            continue\n',
        catch='assert mask not in expected_on_4 or on4 == expected_on_4[mask]',
    ),
    Mutant(
        'error-hides-the-mask',
        NB,
        "choose_gpu's error names the mask that renumbered the GPUs",
        'd2lpar/visibility.py',
        old='    if mask is not None:\n        seen +=',
        new='    if False:\n        seen +=',
        catch="assert 'GPU index 5 does not exist' in error and \"CUDA_VISIBLE_DEVICES='0,5'\" in error",
    ),
    Mutant(
        'typo-check-too-strict',
        NB,
        'a misspelled CUDA variable is found',
        'd2lpar/visibility.py',
        old='cutoff=0.85)',
        new='cutoff=0.99)',
        catch="assert d2lpar.misspelled_cuda_vars(typo['env']) == ['CUDA_VISIBLE_DEVICE']",
    ),
]

MUTANTS += [
    Mutant(
        'export-forgotten',
        NB,
        'export passes the variable to every later command',
        FILE,
        old='export CUDA_VISIBLE_DEVICES=0,2; {probe}',
        new='CUDA_VISIBLE_DEVICES=0,2; {probe}',
        catch="assert lines == ['1', '1,0', 'None', '0,2'], out.stderr",
    ),
    Mutant(
        'child-env-copied-from-os-environ',
        NB,
        'a variable set with os.putenv reaches a child only through the inherited environment',
        FILE,
        old='print(subprocess.run(grandchild, capture_output=True, text=True).stdout.strip())',
        new='print(subprocess.run(grandchild, capture_output=True, text=True, env=dict(os.environ)).stdout.strip())',
        catch="assert (kept, in_environ, inherited) == ('0', 'False', 'PCI_BUS_ID')",
    ),
    Mutant(
        'child-reports-known-names-only',
        NB,
        'a misspelled CUDA variable shows in what the child reports, while the mask stays unset',
        'd2lpar/machinery/programs/mask_child.py',
        old="if 'CUDA' in k.upper() or 'VISIBLE' in k.upper() or k.startswith('OMP_')",
        new="if k in ('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER') or k.startswith('OMP_')",
        catch="assert typo['mask'] is None and typo['env'].get('CUDA_VISIBLE_DEVICE') == ''",
    ),
    Mutant(
        'uuid-regex-lowercase-only',
        NB,
        "nvidia-smi -L's UUIDs are read in either case",
        FILE,
        old=r"\(UUID: GPU-([0-9a-fA-F-]+)\)",
        new=r"\(UUID: GPU-([0-9a-f-]+)\)",
        catch="assert [u.lower() for u in SMI_GPU.findall(example)] == [",
    ),
    Mutant(
        'device-order-misspelled',
        NB,
        'the child really runs with CUDA_DEVICE_ORDER=PCI_BUS_ID',
        FILE,
        old="env={'CUDA_DEVICE_ORDER': 'PCI_BUS_ID'})",
        new="env={'CUDA_DEVICES_ORDER': 'PCI_BUS_ID'})",
        catch="assert pci['env']['CUDA_DEVICE_ORDER'] == 'PCI_BUS_ID'",
    ),
    Mutant(
        'workers-one-at-a-time',
        NB,
        'the processes run side by side',
        FILE,
        old='max_parallel=len(masks)',
        new='max_parallel=1',
        catch="assert time.monotonic() < deadline, 'the other processes never arrived'",
    ),
]

# Checks that only a GPU can run (without one, every child sees no GPU whatever its mask):
# NEEDS-GPU rows on a CPU machine, run by `make mutants MUTANTS_FLAGS=--gpu-only` on a GPU one.
MUTANTS += [
    Mutant(
        'mask-set-before-cuda-starts-in-the-late-child',
        NB,
        'a mask set after CUDA started is ignored: the GPUs stay visible',
        FILE,
        old="LATE = 'import os\\nimport torch\\ntorch.cuda.is_available()  # CUDA initialises here\\n' + SET",
        new="LATE = 'import os\\nimport torch\\n' + SET + 'torch.cuda.is_available()  # CUDA initialises here\\n'",
        catch="assert late['cuda_available'] == (n_gpus > 0)",
        gpus=1,
    ),
    Mutant(
        'trap-child-sets-the-mask-in-time',
        NB,
        "after a late mask, device_count() says 0 while tensors land on the old cuda:0",
        FILE,
        old='TRAP = LATE + textwrap.dedent(',
        new='TRAP = EARLY + textwrap.dedent(',
        catch="assert trap['tensor_on'] == 'cuda:0'",
        gpus=1,
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = [
    "assert s['mask'] == mask and s['device_count'] == len(here), (mask, s['device_count'], here)",
    "assert s['uuids'] == [base['uuids'][p] for p in here], (mask, s['uuids'])  # the GPUs predicted",
    "assert d2lpar.visible_gpus('0,5', 8) == d2lpar.visible_gpus('0, 5', 8) == [0, 5]",
    "assert d2lpar.visible_gpus('0,5', 4) == [0]",
    "assert masks_seen == ['', '', ''], f'the children ended with masks {masks_seen}'",
    "assert hidden == [False, False], f'set in time, \"\" should hide every GPU; CUDA available: {hidden}'",
    "assert threads[1] == threads[2], f'libgomp reads OMP_NUM_THREADS at import: threads {threads}'",
    "assert trap['count_after_setting'] == 0, f\"device_count() said {trap['count_after_setting']}, not 0\"",
    "assert typo['device_count'] == n_gpus and early['device_count'] == 0, (typo['device_count'], n_gpus)",
    "assert d2lpar.misspelled_cuda_vars(early['env']) == []",
    "assert sorted(pci['uuids']) == sorted(base['uuids'])  # the same GPUs, perhaps in another order",
    "assert pci['uuids'] == smi_uuids, 'PCI_BUS_ID order != nvidia-smi order'",
    "assert s['report']['device'] == ('cuda:0' if where else 'cpu'), f'mask {mask!r}: {s[\"report\"]}'",
    "assert s['uuids'] == [base['uuids'][p] for p in where], f'mask {mask!r}: GPUs {s[\"uuids\"]}'",
]
