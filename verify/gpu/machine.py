"""The GPUs the driver lists, and why torch cannot use them: asked before any row."""

import re
import shutil
import subprocess
import sys
from pathlib import Path


def gpu_facts(driver=None):
    """Return lines describing the GPUs, the driver and the torch, CUDA and NCCL builds."""
    import torch
    import d2lpar

    driver = driver or driver_gpus()
    lines = [
        f'torch {torch.__version__}, CUDA {torch.version.cuda or "none"}, '
        f'NCCL {".".join(map(str, torch.cuda.nccl.version())) if d2lpar.num_gpus() else "-"}'
    ]
    for i in range(d2lpar.num_gpus()):
        props = torch.cuda.get_device_properties(i)
        lines.append(f'cuda:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB')
    lines.append(f'driver: {driver["summary"]}')
    problem = d2lpar.gpu_problem()
    lines.append(f'GPUs CUDA can use: {d2lpar.num_gpus()}' + (f' ({problem})' if problem else ''))
    return lines


def driver_gpus(smi='nvidia-smi', proc=Path('/proc/driver/nvidia/gpus')):
    """Ask the NVIDIA driver, not torch, about the GPUs: {'count', 'version', 'cuda', 'summary'}.

    `nvidia-smi -L` lists one line per GPU ("GPU 0: ..."), and its plain output's header
    names the newest CUDA the driver runs ("CUDA Version: 12.4"); /proc/driver/nvidia/gpus
    holds one folder per GPU. A GPU either of them sees counts.
    """
    found = {'count': 0, 'version': None, 'cuda': None, 'exclusive': False}
    exe = shutil.which(smi)
    if exe:

        def ask(*args):
            try:
                return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60).stdout
            except (OSError, subprocess.TimeoutExpired):
                return ''

        found['count'] = sum(1 for line in ask('-L').splitlines() if line.startswith('GPU '))
        header = ask()
        version = re.search(r'Driver Version:\s*([\d.]+)', header)
        cuda = re.search(r'CUDA Version:\s*([\d.]+)', header)
        found['version'], found['cuda'] = version and version.group(1), cuda and cuda.group(1)
        modes = ask('--query-gpu=compute_mode', '--format=csv,noheader').split()
        found['exclusive'] = any('Exclusive' in m for m in modes)
    try:
        found['count'] = max(found['count'], sum(1 for p in Path(proc).iterdir()))
    except OSError:
        pass
    found['summary'] = (
        f'{found["count"]} GPU(s) listed by the NVIDIA driver'
        + (f' {found["version"]}' if found['version'] else '')
        + (f', which runs CUDA up to {found["cuda"]}' if found['cuda'] else '')
        + (', in EXCLUSIVE_PROCESS compute mode' if found['exclusive'] else '')
        if found['count']
        else 'no NVIDIA GPU (nvidia-smi and /proc/driver/nvidia list none)'
    )
    return found


def preflight(driver, usable, torch_cuda, torch_version, visible, allow_cpu):
    """Return (exit status, message) before any row: 0 when gpucheck can verify GPU paths.

    `driver` is driver_gpus()'s answer, `usable` the GPUs CUDA can use (num_gpus()),
    `torch_cuda` torch.version.cuda, `visible` CUDA_VISIBLE_DEVICES (None when unset).
    """
    if usable > 0:
        return 0, None
    if driver['count'] == 0:
        if allow_cpu:
            return 0, ('no GPU here (--allow-cpu): the rows a CPU can run verify no GPU path; every GPU row is SKIPPED')
        return 3, (
            'gpucheck: no GPU here (nvidia-smi and /proc/driver/nvidia list none), so it '
            'would verify no GPU path. Run it on a machine with NVIDIA GPUs, or pass '
            '--allow-cpu to run the rows a CPU can.'
        )
    head = (
        f'gpucheck: the NVIDIA driver lists {driver["count"]} GPU(s), but torch '
        f'{torch_version} can use none of them, so every GPU row would be skipped and the '
        'run would verify nothing. '
    )
    if visible is not None:
        return 2, head + (
            f'CUDA_VISIBLE_DEVICES={visible!r} hides them (torch reads "", "-1" '
            'or an invalid entry as no GPU). Fix: unset it, or list GPU indices '
            'such as CUDA_VISIBLE_DEVICES=0,1.'
        )
    if not torch_cuda:
        return 2, head + (
            'This torch is a CPU-only build. Fix: install a CUDA build of torch '
            '2.13 or newer for the driver\'s CUDA'
            + (f' ({driver["cuda"]} or older)' if driver['cuda'] else '')
            + ' in this environment (the command on pytorch.org/get-started/'
            'locally; its index URLs look like '
            'https://download.pytorch.org/whl/cu126), then run gpucheck again.'
        )
    newer = driver['cuda'] and tuple(map(int, driver['cuda'].split('.')[:2])) < tuple(
        map(int, torch_cuda.split('.')[:2])
    )
    reason = (
        f'This torch is built for CUDA {torch_cuda}, and the driver'
        + (f' {driver["version"]}' if driver['version'] else '')
        + (f' runs CUDA up to {driver["cuda"]}' if driver['cuda'] else '')
        + (
            ': CUDA cannot start. '
            if newer
            else ': CUDA did not start (torch\'s "CUDA initialization" warning says why). '
        )
    )
    return 2, head + reason + (
        'Fix, either: (1) install a driver that runs CUDA ' + torch_cuda + ' or newer; or (2) '
        'install a torch 2.13 or newer built for CUDA '
        + (driver['cuda'] or 'your driver\'s')
        + ' or older into this environment (pytorch.org/get-started/locally gives the command; '
        'its index URLs look like https://download.pytorch.org/whl/cu126), then run '
        f'`{Path(sys.executable).name} verify/gpucheck.py` with that environment\'s python '
        '(make gpucheck installs the newest torch into .venv).'
    )
