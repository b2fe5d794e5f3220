"""Devices: which GPUs exist, and device slots for demos that fall back honestly."""

import os

import torch

__all__ = [
    'try_gpu',
    'try_all_gpus',
    'num_gpus',
    'gpu_problem',
    'device_slots',
    'hardware_tier',
    'synchronize',
    'small_workload',
    'env_flag',
]


def num_gpus():
    """Return the number of GPUs this process can compute on (0 if CUDA cannot start)."""
    # Before CUDA starts, torch.cuda.device_count() counts GPUs through NVML (torch 2.14's
    # torch/cuda/__init__.py: device_count -> _device_count_nvml), which succeeds even
    # when the driver is too old for this build; is_available() asks the CUDA runtime
    # (cudaGetDeviceCount), which then finds none. Only GPUs both agree on are usable.
    count = torch.cuda.device_count()
    return count if count > 0 and torch.cuda.is_available() else 0


def gpu_problem():
    """Return why GPUs that torch counts cannot be used, or None when there is no such problem."""
    count = torch.cuda.device_count()
    if count == 0 or torch.cuda.is_available():
        return None
    return (
        f'torch.cuda.device_count() counts {count} GPU(s), but CUDA cannot start on them '
        f'(torch.cuda.is_available() is False), so everything runs on the CPU. Most often '
        f'the NVIDIA driver is older than this torch build (CUDA {torch.version.cuda}) '
        f'needs: update the driver, or install a torch built for an older CUDA. torch\'s '
        f'"CUDA initialization" warning, printed the first time CUDA was asked, says more.'
    )


def try_gpu(i=0):
    """Return the device of GPU `i` when this process can use it, else the CPU."""
    if not isinstance(i, int) or isinstance(i, bool):
        raise TypeError(f'try_gpu(i) needs an int GPU index such as 0 or 1, got {type(i).__name__} {i!r}')
    # A negative index is no GPU: without the lower bound, try_gpu(-1) gave cuda:-1.
    if 0 <= i < num_gpus():
        return torch.device(f'cuda:{i}')
    return torch.device('cpu')


def try_all_gpus():
    """Return a device for every GPU this process can use; just the CPU when there are none."""
    devices = [torch.device(f'cuda:{i}') for i in range(num_gpus())]
    return devices if devices else [torch.device('cpu')]


def device_slots(n, verbose=True):
    """Return `n` device slots for a multi-device demo, reusing devices if needed.

    With at least `n` GPUs the slots are `cuda:0 .. cuda:n-1`. With fewer GPUs
    the visible GPUs are reused in turn, and without CUDA every slot is the
    CPU. Reused slots still hold independent copies of whatever is placed on
    them, so the arithmetic of a demo is unchanged; only the speed is not that
    of `n` separate devices, and `verbose` says so.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f'device_slots(n) needs a positive int n, got {n!r}')
    gpus = num_gpus()
    if gpus >= n:
        slots = [torch.device(f'cuda:{i}') for i in range(n)]
        note = f'{n} slot(s) on {n} separate GPU(s)'
    elif gpus > 0:
        slots = [torch.device(f'cuda:{i % gpus}') for i in range(n)]
        note = (
            f'asked for {n} slots but only {gpus} GPU(s) are visible: '
            f'the slots share them, so results are exact but not faster'
        )
    else:
        slots = [torch.device('cpu')] * n
        note = (
            f'no GPU visible: {n} slot(s) on the CPU, holding '
            f'independent copies; results are exact, the speed is the CPU\'s'
        )
        problem = gpu_problem()
        if problem:
            note += f'\n  (no usable GPU: {problem})'
    if verbose:
        print(f'device slots {[str(d) for d in slots]}: {note}')
    return slots


def hardware_tier():
    """Return the course's hardware tier of this machine as a short string."""
    gpus = num_gpus()
    if gpus == 0:
        return 'CPU only'
    return '1 GPU' if gpus == 1 else f'{gpus} GPUs'


def synchronize(device=None):
    """Wait for queued work on `device`, or on every GPU if None; no-op on the CPU."""
    if device is not None:
        if torch.device(device).type == 'cuda' and torch.cuda.is_available():
            torch.cuda.synchronize(device)
        return
    # torch.cuda.synchronize(None) waits for the current GPU only (torch 2.14's
    # torch/cuda/__init__.py: "It uses the current device ... if device is None"), so
    # wait for each GPU in turn. No work is queued before CUDA starts, nor on a GPU
    # without a CUDA context; synchronizing such a GPU would create a context there
    # (cudaSetDevice does since CUDA 12), which costs hundreds of MiB of its memory.
    if not torch.cuda.is_initialized():
        return
    has_context = getattr(torch._C, '_cuda_hasPrimaryContext', lambda i: True)
    for i in range(num_gpus()):
        if has_context(i):
            torch.cuda.synchronize(i)


def small_workload():
    """Return True when notebooks should run their small CI workload.

    The test suite sets D2LPAR_SMALL=1; learners get the full workload.
    """
    return env_flag('D2LPAR_SMALL')


def env_flag(name):
    """Return the on/off setting of environment variable `name` (unset means off)."""
    value = os.environ.get(name, '').strip().lower()
    if value in ('', '0', 'false', 'no', 'off'):
        return False
    if value in ('1', 'true', 'yes', 'on'):
        return True
    raise ValueError(f'{name}={os.environ[name]!r} is neither on nor off: set it to 1 (on) or 0 (off), or unset it')
