"""Planted bugs for notebook 1, computing on one chosen device."""

from verify.mutants.registry import Mutant

NB = '01_single_device'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant(
        'saved-bytes-ignore-no-grad',
        NB,
        'no_grad keeps no activations',
        FILE,
        old='torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.set_grad_enabled(grad):',
        new='torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.set_grad_enabled(True):',
        catch='assert kept_no_grad == 0 < kept',
        quick=True,
    ),
    Mutant(
        'choose-gpu-one-past-the-end',
        NB,
        'choose_gpu refuses a GPU that does not exist',
        'd2lpar/visibility.py',
        old='    if 0 <= i < n:\n',
        new='    if 0 <= i <= n:\n',
        # accepted, so no error to look at: the cell's `else` branch is what fails
        catch="raise AssertionError('choose_gpu accepted an index that does not exist')",
    ),
    Mutant(
        'choose-gpu-error-hides-the-index',
        NB,
        'choose_gpu says which index does not exist',
        'd2lpar/visibility.py',
        old="raise ValueError(f'GPU index {i} does not exist: this process sees",
        new="raise ValueError(f'That GPU index does not exist: this process sees",
        catch="assert f'GPU index {bad} does not exist' in str(e)",
    ),
    Mutant(
        'round-trip-through-float16',
        NB,
        'a copy to a device and back keeps every bit',
        FILE,
        old='X_dst = X_src.to(dst)',
        new='X_dst = X_src.to(dst, torch.float16)',
        catch='assert torch.equal(X_dst.cpu(), X)',
    ),
]

MUTANTS += [
    Mutant(
        'any-device-as-compiled',
        NB,
        'device-agnostic code computes where it can run',
        FILE,
        old="any_device = usable if usable is not None else torch.device('cpu')",
        new="any_device = built_for if built_for is not None else torch.device('cpu')",
        catch='assert (torch.ones(2, device=any_device) * 2).sum().item() == 4',
    ),
    Mutant(
        'copy-that-aliases',
        NB,
        "on the CPU .to('cpu') is no copy: copy=True makes one",
        FILE,
        old="Y = X.to('cpu', copy=True)",
        new="Y = X.to('cpu')",
        catch='assert X[0, 0] == 100  # the copy left X alone',
    ),
    Mutant(
        'data-left-behind',
        NB,
        'the fix moves the data to where the model is',
        FILE,
        old='out = wrong(data.to(where))',
        new='out = wrong(data)',
        # the model's forward itself refuses data on another device: the cell fails there
        catch='where = next(wrong.parameters()).device',
    ),
    Mutant(
        'timed-copy-copies-nothing',
        NB,
        'each timed call really copies X',
        FILE,
        old='calls = [lambda: X.clone(), lambda: X.view(-1, 4)]',
        new='calls = [lambda: torch.empty_like(X), lambda: X.view(-1, 4)]',
        catch='assert torch.equal(f().cpu().reshape(X.shape), X)',
    ),
    Mutant(
        'inference-without-eval',
        NB,
        'in eval mode an image does not depend on its batch',
        FILE,
        old='net = torchvision.models.resnet18(weights=None).eval().to(device)',
        new='net = torchvision.models.resnet18(weights=None).to(device)',
        catch='torch.testing.assert_close(alone, together, rtol=1e-4, atol=1e-4)',
    ),
    Mutant(
        'peak-measured-without-autograd',
        NB,
        'autograd raises the peak of a forward pass',
        FILE,
        old='with tracker, torch.set_grad_enabled(grad):',
        new='with tracker, torch.no_grad():',
        catch="assert peaks[True]['Total'] > peaks[False]['Total']",
    ),
]

# Checks that only a GPU can run (their CPU branch prints what the GPU would show): NEEDS-GPU
# rows on a CPU machine, run by `make mutants MUTANTS_FLAGS=--gpu-only` on a GPU one.
MUTANTS += [
    Mutant(
        'pinned-copy-read-before-the-event',
        NB,
        'a non_blocking copy to the host is complete only after its event',
        FILE,
        old='    done.synchronize()                        # now Y holds what the GPU sent\n',
        new='',
        catch='assert torch.equal(Y, torch.arange(2**22, dtype=torch.float32))',
        gpus=1,
    ),
    Mutant(
        'a-second-reference-keeps-the-memory',
        NB,
        'memory_allocated counts live tensors: back where it was after del',
        FILE,
        old='    del big\n',
        new='    kept = [big]  # a reference left in a list, as a cache or a log would keep it\n    del big\n',
        catch='assert grown >= 4 * 2**20 and torch.cuda.memory_allocated(device) == before',
        gpus=1,
    ),
    Mutant(
        'copy-left-on-the-source',
        NB,
        'X.to(device) puts the copy on that device',
        FILE,
        old='X_dst = X_src.to(dst)',
        new='X_dst = X_src.to(src)',
        catch="assert [X_src.get_device(), X_dst.get_device()] == [-1 if d.type == 'cpu' else d.index",
        gpus=1,
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = []
