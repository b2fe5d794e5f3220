"""What this machine can do (notebook 7): a C++ compiler for inductor, pinned memory, bfloat16."""

import os
import shutil
import subprocess
import sys
import tempfile

import torch

__all__ = ['cxx_compiler', 'inductor_works', 'loader_pins', 'bf16_in_hardware']


def cxx_compiler():
    """Return the path of the C++ compiler torch.compile's inductor would use, or None."""
    for name in (os.environ.get('CXX'), 'g++', 'c++', 'clang++'):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


_INDUCTOR_PROBE = """
import torch
f = torch.compile(lambda x: (x.sin() + 1).sum(), backend='inductor')
assert abs(f(torch.ones(8)).item() - 8 * (1 + torch.ones(1).sin().item())) < 1e-4
print('inductor works')
"""


def inductor_works(timeout=300):
    """Return (True, '') if inductor compiles a CPU kernel here, else (False, why).

    inductor needs a C++ compiler, and on macOS also OpenMP's `omp.h` (Apple's clang
    has none: `brew install libomp`). Rather than guess each requirement, compile one
    tiny function in a fresh process (with an empty kernel cache) and see.
    """
    if cxx_compiler() is None:
        return False, 'no C++ compiler found (g++, c++ or clang++ on PATH, or $CXX)'
    with tempfile.TemporaryDirectory(prefix='d2lpar-inductor-') as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS='1')
        try:
            done = subprocess.run(
                [sys.executable, '-c', _INDUCTOR_PROBE], capture_output=True, text=True, timeout=timeout, env=env
            )
        except subprocess.TimeoutExpired:
            return False, f'compiling one tiny kernel took over {timeout} s'
    if done.returncode == 0 and 'inductor works' in done.stdout:
        return True, ''
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    why = next((line for line in lines if 'error' in line.lower() and '.h' in line), None)
    return False, (why or (lines[-1] if lines else f'exit status {done.returncode}')).strip()


def loader_pins():
    """Return whether DataLoader(pin_memory=True) really pins here (not without an accelerator,
    not on Apple's MPS, where the DataLoader turns it off with a warning)."""
    if not torch.accelerator.is_available():
        return False
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    return accelerator is not None and accelerator.type != 'mps'


def bf16_in_hardware():
    """Return whether this CUDA GPU computes bfloat16 in hardware (Ampere and later).

    `torch.cuda.is_bf16_supported()` alone also says True on older GPUs such as a T4,
    which only emulate bfloat16, slowly.
    """
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
