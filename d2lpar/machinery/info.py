"""Reports on the machine: `python -m d2lpar info` and each notebook's first cell."""

import os
import platform

import torch

from ..data import fashion_mnist_source
from ..devices import gpu_problem, hardware_tier, num_gpus, small_workload

__all__ = ['report', 'show_setup', 'torch_problem']

# The oldest torch the course is tested on (pyproject.toml's lower bound; README, "Versions").
TORCH_FLOOR = (2, 13)


def torch_problem(version=None):
    """Return why this torch is older than the course supports, or None."""
    version = torch.__version__ if version is None else version
    parts = version.split('+')[0].split('.')
    try:
        found = tuple(int(p) for p in parts[:2])
    except ValueError:  # a development build such as '2.16.0a0': newer than any floor
        return None
    if found >= TORCH_FLOOR:
        return None
    floor = '.'.join(map(str, TORCH_FLOOR))
    return (
        f'torch {version} is older than {floor}, the oldest release this course is tested '
        f'on: some cells will fail. Install torch>={floor} built for your GPU driver '
        '(README, "On a hosted notebook service").'
    )


def _backends():
    import torch.distributed as dist

    if not dist.is_available():
        return {'nccl': False, 'gloo': False, 'mpi': False}
    return {'nccl': dist.is_nccl_available(), 'gloo': dist.is_gloo_available(), 'mpi': dist.is_mpi_available()}


def report():
    """Return a multi-line report of torch, CUDA, GPUs, backends and CPUs."""
    import torchvision

    cuda = torch.version.cuda or 'none (CPU-only build)'
    lines = [
        'd2lpar hardware report',
        f'  python            {platform.python_version()} ({platform.system()} {platform.machine()})',
        f'  torch             {torch.__version__} (built with CUDA {cuda})',
        f'  torchvision       {torchvision.__version__}',
        *([f'  torch problem     {torch_problem()}'] if torch_problem() else []),
        f'  CUDA_VISIBLE_DEVICES = {os.environ.get("CUDA_VISIBLE_DEVICES", "(not set)")!s}',
        f'  CUDA available    {torch.cuda.is_available()}',
    ]
    gpus = num_gpus()
    for i in range(gpus):
        props = torch.cuda.get_device_properties(i)
        lines.append(
            f'  cuda:{i}            {props.name}, {props.total_memory / 2**30:.1f} GiB, '
            f'compute capability {props.major}.{props.minor}'
        )
    if gpus == 0:
        lines.append('  GPUs              none visible')
    problem = gpu_problem()
    if problem:
        lines.append(f'  GPU problem       {problem}')
    backends = _backends()
    lines.append('  dist backends     ' + ', '.join(f'{name} {"yes" if ok else "no"}' for name, ok in backends.items()))
    lines.append(f'  CPU cores         {os.cpu_count()} (torch uses {torch.get_num_threads()} threads)')
    lines.append(f'  hardware tier     {hardware_tier()}')
    return '\n'.join(lines)


def show_setup(data=False):
    """Print the hardware tier (and with `data`, which Fashion-MNIST is used)."""
    gpus = num_gpus()
    names = ', '.join(torch.cuda.get_device_name(i) for i in range(gpus)) or 'no GPU visible'
    print(f'hardware tier: {hardware_tier()} ({names}); torch {torch.__version__}, {os.cpu_count()} CPU cores')
    problem = gpu_problem()
    if problem:
        print(f'no usable GPU: {problem}')
    if torch_problem():
        print(f'WARNING: {torch_problem()}')
    print(f'workload: {"small (D2LPAR_SMALL=1)" if small_workload() else "full"}')
    if data:
        print(f'Fashion-MNIST: {fashion_mnist_source()}')
