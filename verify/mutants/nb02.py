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
        'putenv-as-assignment',
        NB,
        'os.putenv reaches children but not os.environ (told apart from an assignment)',
        FILE,
        old="os.putenv('CUDA_DEVICE_ORDER', 'PCI_BUS_ID')",
        new="os.environ['CUDA_DEVICE_ORDER'] = 'PCI_BUS_ID'",
        catch="assert (kept, in_environ, inherited) == ('0', 'False', 'PCI_BUS_ID')",
    ),
    Mutant(
        'typo-child-spelled-right',
        NB,
        'the misspelled variable never sets the mask (told apart from the right spelling)',
        FILE,
        old="code=\"import os\\nos.environ['CUDA_VISIBLE_DEVICE'] = ''\\n\"",
        new="code=\"import os\\nos.environ['CUDA_VISIBLE_DEVICES'] = ''\\n\"",
        catch="assert typo['mask'] is None and typo['env']['CUDA_VISIBLE_DEVICE'] == ''",
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
        catch="assert s['report']['device'] == ('cuda:0' if where else 'cpu')",
    ),
]
