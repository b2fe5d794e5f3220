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


# Per-check mutants (issue 33): each fails its named check first.
MUTANTS += [
    Mutant(
        'mask-entries-not-stripped',
        NB,
        "entries are read like C's strtoul: '0, 5' is '0,5'",
        'd2lpar/visibility.py',
        old='x = _strtoul(entry.strip())',
        new='x = _strtoul(entry)',
        catch="assert d2lpar.visible_gpus('0,5', 8) == d2lpar.visible_gpus('0, 5', 8) == [0, 5]",
    ),
    Mutant(
        'mask-set-with-putenv',
        NB,
        'the children end with the mask they set in os.environ',
        FILE,
        old="\"os.environ['CUDA_VISIBLE_DEVICES'] = ''\\n\"",
        new="\"os.putenv('CUDA_VISIBLE_DEVICES', '')\\n\"",
        catch="assert masks_seen == ['', '', '']",
    ),
    Mutant(
        'after-import-child-copied-from-early',
        NB,
        'OMP_NUM_THREADS set after import torch changes nothing',
        FILE,
        old="AFTER_IMPORT = 'import os\\nimport torch\\n' + SET",
        new='AFTER_IMPORT = EARLY  # copied from the line above',
        catch='assert threads[1] == threads[2]',
    ),
    Mutant(
        'known-cuda-vars-not-skipped',
        NB,
        'correctly spelled CUDA variables are not reported',
        'd2lpar/visibility.py',
        old='if name in _KNOWN_VARS or name in _OTHER_VARS:',
        new='if name in _OTHER_VARS:',
        catch="assert d2lpar.misspelled_cuda_vars(early['env']) == []",
    ),
]

# GPU-only per-check mutants: on a CPU machine every child sees no GPU whatever its mask.
MUTANTS += [
    Mutant(
        'children-reported-in-completion-order',
        NB,
        "each child's report is the one of its own mask",
        'd2lpar/machinery/masks.py',
        old='runs = [f.result() for f in futures]',
        new='runs = [f.result() for f in concurrent.futures.as_completed(futures)]',
        catch="assert s['mask'] == mask and s['device_count'] == len(here)",
        gpus=1,
    ),
    Mutant(
        'after-import-child-starts-cuda',
        NB,
        'a mask set after import torch, before CUDA starts, still hides the GPUs',
        FILE,
        old="AFTER_IMPORT = 'import os\\nimport torch\\n' + SET",
        new="AFTER_IMPORT = 'import os\\nimport torch\\ntorch.cuda.is_available()\\n' + SET",
        catch='assert hidden == [False, False]',
        gpus=1,
    ),
    Mutant(
        'trap-child-never-sets-the-mask',
        NB,
        'device_count() follows a mask set after CUDA started',
        FILE,
        old='TRAP = LATE + textwrap.dedent(',
        new='TRAP = LATE.replace(SET, "") + textwrap.dedent(',
        catch="assert trap['count_after_setting'] == 0",
        gpus=1,
    ),
    Mutant(
        'worker-data-left-on-the-cpu',
        NB,
        'each process computes on the GPU its mask shows',
        FILE,
        old='X = torch.randn(256, 256, device=device)',
        new='X = torch.randn(256, 256)',
        catch="assert s['report']['device'] == ('cuda:0' if where else 'cpu')",
        gpus=1,
    ),
    Mutant(
        'side-by-side-masks-dropped',
        NB,
        'each process sees only the GPU its mask names',
        FILE,
        old='return d2lpar.run_with_masks(masks, code=WORKER',
        new='return d2lpar.run_with_masks([None] * len(masks), code=WORKER',
        catch="assert s['uuids'] == [base['uuids'][p] for p in where]",
        gpus=2,
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = [
    # Needs 2+ GPUs, and every prediction bug fails the 4-GPU table (or the count) first: only a child
    # showing the right number of GPUs but other ones fails it, which no code of the course decides.
    "assert s['uuids'] == [base['uuids'][p] for p in here], (mask, s['uuids'])  # the GPUs predicted",
    # Measures CUDA itself ignoring the misspelled name: a bug that sets the real mask in the typo child
    # fails the check above first; early['device_count'] == 0 follows from `hidden` (notebook cell 10).
    "assert typo['device_count'] == n_gpus and early['device_count'] == 0, (typo['device_count'], n_gpus)",
    # Measures the driver (the PCI order lists the same GPUs): no code of the course decides which
    # GPUs an unmasked child sees, so no planted bug fails it first.
    "assert sorted(pci['uuids']) == sorted(base['uuids'])  # the same GPUs, perhaps in another order",
    # Needs nvidia-smi and GPUs whose default order differs from the PCI order for a bug (a missing
    # CUDA_DEVICE_ORDER) to show; regex bugs fail the example check of the same cell first.
    "assert pci['uuids'] == smi_uuids, 'PCI_BUS_ID order != nvidia-smi order'",
]
