"""Planted bugs for notebook 1, computing on one chosen device."""
from verify.mutants.registry import Mutant

NB = '01_single_device'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant('saved-bytes-ignore-no-grad', NB, 'no_grad keeps no activations', FILE,
           old='torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.set_grad_enabled(grad):',
           new='torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.set_grad_enabled(True):',
           catch='assert kept_no_grad == 0 < kept', quick=True),
    Mutant('choose-gpu-one-past-the-end', NB, 'choose_gpu refuses a GPU that does not exist',
           'd2lpar/visibility.py', old='    if 0 <= i < n:\n', new='    if 0 <= i <= n:\n',
           catch="assert f'GPU index {bad} does not exist' in str(e)"),
    Mutant('round-trip-through-float16', NB, 'a copy to a device and back keeps every bit', FILE,
           old='X_dst = X_src.to(dst)', new='X_dst = X_src.to(dst, torch.float16)',
           catch='assert torch.equal(X_dst.cpu(), X)'),
]
