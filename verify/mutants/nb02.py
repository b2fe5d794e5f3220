"""Planted bugs for notebook 2, CUDA_VISIBLE_DEVICES."""
from verify.mutants.registry import Mutant

NB = '02_visible_devices'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant('mask-set-after-import', NB, 'variables set before import torch take effect', FILE,
           old="EARLY = 'import os\\n' + SET + 'import torch\\n'",
           new="EARLY = 'import os\\nimport torch\\n' + SET",
           catch="assert early['report']['threads'] == 1", quick=True),
    Mutant('duplicate-ordinal-kept', NB, 'an entry listed twice empties the mask',
           'd2lpar/visibility.py', old='        if x in ordinals:\n            return []\n',
           new='', catch='assert mask not in expected_on_4 or on4 == expected_on_4[mask]'),
    Mutant('invalid-entry-skipped', NB, 'parsing stops at the first invalid entry',
           'd2lpar/visibility.py', old='        if x < 0:\n            break\n',
           new='        if x < 0:\n            continue\n',
           catch='assert mask not in expected_on_4 or on4 == expected_on_4[mask]'),
    Mutant('error-hides-the-mask', NB, "choose_gpu's error names the mask that renumbered the GPUs",
           'd2lpar/visibility.py', old='    if mask is not None:\n        seen +=',
           new='    if False:\n        seen +=',
           catch="assert 'GPU index 5 does not exist' in error and \"CUDA_VISIBLE_DEVICES='0,5'\" in error"),
    Mutant('typo-check-too-strict', NB, 'a misspelled CUDA variable is found', 'd2lpar/visibility.py',
           old='cutoff=0.85)', new='cutoff=0.99)',
           catch="assert d2lpar.misspelled_cuda_vars(typo['env']) == ['CUDA_VISIBLE_DEVICE']"),
]
