"""Reports on the machine: `python -m d2lpar info` and each notebook's first cell."""
import os
import platform

import torch

from .data import fashion_mnist_source
from .devices import gpu_problem, hardware_tier, num_gpus, small_workload

__all__ = ['report', 'show_setup']


def _backends():
    import torch.distributed as dist
    if not dist.is_available():
        return {'nccl': False, 'gloo': False, 'mpi': False}
    return {'nccl': dist.is_nccl_available(), 'gloo': dist.is_gloo_available(),
            'mpi': dist.is_mpi_available()}


def report():
    """Return a multi-line report of torch, CUDA, GPUs, backends and CPUs."""
    import torchvision
    cuda = torch.version.cuda or 'none (CPU-only build)'
    lines = ['d2lpar hardware report',
             f'  python            {platform.python_version()} ({platform.system()} {platform.machine()})',
             f'  torch             {torch.__version__} (built with CUDA {cuda})',
             f'  torchvision       {torchvision.__version__}',
             f'  CUDA_VISIBLE_DEVICES = {os.environ.get("CUDA_VISIBLE_DEVICES", "(not set)")!s}',
             f'  CUDA available    {torch.cuda.is_available()}']
    gpus = num_gpus()
    for i in range(gpus):
        props = torch.cuda.get_device_properties(i)
        lines.append(f'  cuda:{i}            {props.name}, {props.total_memory / 2**30:.1f} GiB, '
                     f'compute capability {props.major}.{props.minor}')
    if gpus == 0:
        lines.append('  GPUs              none visible')
    problem = gpu_problem()
    if problem:
        lines.append(f'  GPU problem       {problem}')
    backends = _backends()
    lines.append('  dist backends     ' + ', '.join(
        f'{name} {"yes" if ok else "no"}' for name, ok in backends.items()))
    lines.append(f'  CPU cores         {os.cpu_count()} (torch uses {torch.get_num_threads()} threads)')
    lines.append(f'  hardware tier     {hardware_tier()}')
    return '\n'.join(lines)


def show_setup(data=False):
    """Print the hardware tier (and with `data`, which Fashion-MNIST is used)."""
    gpus = num_gpus()
    names = ', '.join(torch.cuda.get_device_name(i) for i in range(gpus)) or 'no GPU visible'
    print(f'hardware tier: {hardware_tier()} ({names}); torch {torch.__version__}, '
          f'{os.cpu_count()} CPU cores')
    problem = gpu_problem()
    if problem:
        print(f'no usable GPU: {problem}')
    print(f'workload: {"small (D2LPAR_SMALL=1, as under the test suite)" if small_workload() else "full"}')
    if data:
        print(f'Fashion-MNIST: {fashion_mnist_source()}')
