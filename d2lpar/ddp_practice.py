"""DDP in practice (notebook 7): accumulation, mixed precision, uneven inputs, evaluation.

The functions a notebook cell writes (d2l's `#@save`) come first: one
optimizer step over k micro-batches with `no_sync`, a training step under
`torch.autocast`, training on uneven inputs with `join`, evaluation sharded
over ranks that counts every sample once, the number of DataLoader workers a
rank may start, and a compile backend that records the graphs it receives.
Helpers that teach nothing about parallelism follow: finding a C++ compiler,
reading a profiler's events, drawing them as a timeline.
"""
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from ._checks import checked, positive_int, process_group_size

__all__ = ['accumulate_step', 'amp_step', 'train_uneven', 'evaluate_distributed',
           'loader_workers', 'counting_backend', 'cxx_compiler', 'inductor_works',
           'loader_pins', 'bf16_in_hardware', 'profile_intervals', 'overlap_report',
           'plot_comm_timeline']


def _check_accumulate_step(net, optimizer, micro_batches, loss_fn):
    if not hasattr(net, 'no_sync'):
        raise TypeError(f'accumulate_step: net must be a DistributedDataParallel model (it has '
                        f'no_sync()), got {type(net).__name__}; wrap it first: net = DDP(net)')
    if not callable(loss_fn):
        raise TypeError(f'accumulate_step: loss_fn must be callable, got {loss_fn!r}')
    try:
        micro_batches = list(micro_batches)
    except TypeError:
        raise TypeError('accumulate_step: micro_batches must be a list of (X, y) pairs, got '
                        f'{type(micro_batches).__name__}') from None
    if not micro_batches:
        raise ValueError('accumulate_step: micro_batches is empty; pass at least one (X, y) pair')
    for batch in micro_batches:
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise TypeError(f'accumulate_step: each micro-batch must be an (X, y) pair, got '
                            f'{type(batch).__name__}')
    sizes = [len(y) for _, y in micro_batches]
    if len(set(sizes)) > 1:
        # Dividing each mean loss by k gives the mean over all samples only for equal sizes.
        raise ValueError(f'accumulate_step: micro-batches must have equal sizes, got {sizes}; '
                         'dividing each loss by k would weight their samples unequally. Split '
                         'the batch evenly, or weight each loss by its share of the samples '
                         '(exercise 5 of notebook 7)')
    return (net, optimizer, micro_batches, loss_fn), {}


@checked(_check_accumulate_step)
def accumulate_step(net, optimizer, micro_batches, loss_fn):
    """Take one optimizer step over k equal micro-batches; allreduce only after the last one."""
    optimizer.zero_grad()
    k, total = len(micro_batches), 0.0
    for i, (X, y) in enumerate(micro_batches):
        last = i == k - 1
        with contextlib.nullcontext() if last else net.no_sync():  # no allreduce: accumulate
            loss = loss_fn(net(X), y) / k  # the mean of k equal means is the big batch's mean
            loss.backward()  # the last backward allreduces the sum of all k gradients
        total = total + loss.detach()
    optimizer.step()
    return total


def _check_amp_step(net, optimizer, X, y, loss_fn, scaler=None):
    if not isinstance(X, torch.Tensor):
        raise TypeError(f'amp_step: X must be a tensor, got {type(X).__name__}')
    if X.device.type == 'cuda' and scaler is None:
        raise ValueError('amp_step: float16 on a GPU needs a GradScaler (small gradients '
                         "underflow to 0 otherwise): pass scaler=torch.amp.GradScaler('cuda')")
    if not callable(loss_fn):
        raise TypeError(f'amp_step: loss_fn must be callable, got {loss_fn!r}')


@checked(_check_amp_step)
def amp_step(net, optimizer, X, y, loss_fn, scaler=None):
    """Take one step under autocast: bfloat16 on CPU, float16 with a GradScaler on a GPU."""
    dtype = torch.float16 if X.device.type == 'cuda' else torch.bfloat16
    optimizer.zero_grad()
    with torch.autocast(X.device.type, dtype=dtype):
        loss = loss_fn(net(X), y)  # matmuls in 16 bits; autocast keeps the loss in float32
    if scaler is None:
        loss.backward()  # the parameters and their gradients stay float32
        optimizer.step()
    else:  # float16 gradients underflow: scale the loss up, unscale before the step
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # skips the step when a gradient is inf or NaN
        scaler.update()
    return loss.detach()


def _check_train_uneven(net, optimizer, batches, loss_fn):
    if not hasattr(net, 'join'):
        raise TypeError(f'train_uneven: net must be a DistributedDataParallel model (it has '
                        f'join()), got {type(net).__name__}')
    if not callable(loss_fn):
        raise TypeError(f'train_uneven: loss_fn must be callable, got {loss_fn!r}')


@checked(_check_train_uneven)
def train_uneven(net, optimizer, batches, loss_fn):
    """Train on however many batches this rank has; ranks done early shadow the others."""
    steps = 0
    with net.join():  # a finished rank joins the others' allreduces with zero gradients
        for X, y in batches:
            optimizer.zero_grad()
            loss_fn(net(X), y).backward()
            optimizer.step()
            steps += 1
    return steps


def _check_evaluate_distributed(net, dataset, batch_size):
    process_group_size('evaluate_distributed')
    if not isinstance(net, torch.nn.Module):
        raise TypeError(f'evaluate_distributed: net must be an nn.Module (pass net.module for a '
                        f'DDP model), got {type(net).__name__}')
    positive_int(batch_size, 'evaluate_distributed: batch_size')
    if not hasattr(dataset, '__len__'):
        raise TypeError(f'evaluate_distributed: the dataset must have a length (a map-style '
                        f'Dataset such as TensorDataset), got {type(dataset).__name__}; '
                        'DistributedSampler shards by index, which an iterable dataset has not')
    if len(dataset) == 0:
        raise ValueError('evaluate_distributed: the dataset is empty; there is nothing to count')


@checked(_check_evaluate_distributed)
def evaluate_distributed(net, dataset, batch_size):
    """Return (correct, total) over `dataset` sharded over the ranks, each sample counted once."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    sampler = DistributedSampler(dataset, shuffle=False)  # pads the shards to equal length
    num_real = len(range(rank, len(dataset), world_size))  # what follows them is padding
    device = next(net.parameters()).device
    counts, seen = torch.zeros(2, dtype=torch.int64, device=device), 0
    was_training = net.training
    net.eval()
    with torch.no_grad():
        for X, y in DataLoader(dataset, batch_size, sampler=sampler):
            keep = max(0, min(len(y), num_real - seen))  # drop the padded duplicates
            seen += len(y)
            hits = (net(X.to(device)).argmax(1) == y.to(device))[:keep]
            counts += torch.stack([hits.sum(), torch.tensor(keep, device=device)])
    net.train(was_training)
    dist.all_reduce(counts)  # SUM: correct and total over all ranks
    return counts[0].item(), counts[1].item()


def _check_loader_workers(nproc_per_node, cores=None):
    positive_int(nproc_per_node, 'loader_workers: nproc_per_node')
    if cores is not None:
        positive_int(cores, 'loader_workers: cores')


@checked(_check_loader_workers)
def loader_workers(nproc_per_node, cores=None):
    """Return DataLoader workers per rank so that ranks x (workers + 1) fit the cores."""
    if cores is None:  # a container or taskset may allow fewer cores than os.cpu_count()
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity')
                 else os.cpu_count())
    return max(0, cores // nproc_per_node - 1)  # one core for the rank itself; 0: it loads


def counting_backend(graphs, backend):
    """Return a torch.compile backend that records each graph in `graphs`, then compiles it."""
    compile_fn = torch._dynamo.lookup_backend(backend)

    def compile_graph(gm, example_inputs):
        graphs.append(gm)  # with DDP's optimizer: one graph per bucket
        return compile_fn(gm, example_inputs)
    return compile_graph


# ------------------------------------------------------------ helpers that teach no parallelism

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
            done = subprocess.run([sys.executable, '-c', _INDUCTOR_PROBE], capture_output=True,
                                  text=True, timeout=timeout, env=env)
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


def profile_intervals(prof, names=('backward', 'autograd::engine::evaluate_function',
                                   'c10d::allreduce_', 'gloo:all_reduce', 'nccl:all_reduce',
                                   'step')):
    """Return [(name, start_us, end_us, thread)] of the CPU events whose names start with `names`.

    With ProfilerActivity.CUDA every record_function range comes back twice: on the CPU
    and as a GPU-side `gpu_user_annotation` event of the same name. Only the CPU one counts.
    On NCCL the CPU's `nccl:all_reduce` range is only the launch; the all-reduce itself is
    a GPU kernel (ncclDevKernel_AllReduce_...), returned as 'nccl kernel' with its GPU times.
    """
    from torch.autograd import DeviceType
    found = []
    for event in prof.events():
        if event.device_type == DeviceType.CPU and event.name.startswith(tuple(names)):
            found.append((event.name, event.time_range.start, event.time_range.end,
                          int(event.thread)))
        elif (event.device_type == DeviceType.CUDA and event.name.startswith('nccl')
              and 'Kernel' in event.name):
            found.append(('nccl kernel', event.time_range.start, event.time_range.end,
                          int(event.thread)))
    return sorted(found, key=lambda e: e[1])


def overlap_report(intervals):
    """Return per step: its backward, gradient computations, allreduce launches and work.

    `intervals` come from profile_intervals of steps wrapped in
    record_function('step i') with the backward in record_function('backward').
    For each step: when the last gradient computation (autograd op) started and
    ended, when the first allreduce was launched, and how long the allreduce
    work (gloo's threads, or NCCL's kernels on the GPU) overlapped the gradient
    computations.
    """
    steps = [e for e in intervals if e[0].startswith('step')]
    report = []
    for k, (name, start, end, _) in enumerate(steps):
        inside = [e for e in intervals if start <= e[1] <= end]
        grads = [e for e in inside if e[0].startswith('autograd::engine')]
        launches = [e for e in inside if e[0] == 'c10d::allreduce_']
        # A GPU kernel may run after its step's CPU range ends: until the next step starts.
        until = steps[k + 1][1] if k + 1 < len(steps) else float('inf')
        work = ([e for e in intervals if e[0] == 'nccl kernel' and start <= e[1] < until]
                or [e for e in inside if e[0] in ('gloo:all_reduce', 'nccl:all_reduce')])
        if not grads or not (launches or work):
            continue
        last_grad = max(grads, key=lambda e: e[1])
        grad_end = max(e[2] for e in grads)
        overlap = sum(max(0.0, min(w[2], grad_end) - w[1]) for w in work)
        report.append({'step': name, 'grads': len(grads), 'allreduces': len(launches or work),
                       'last_grad_start': last_grad[1] - start, 'grads_end': grad_end - start,
                       'first_launch': min(e[1] for e in launches or work) - start,
                       'work_overlap_us': overlap})
    return report


def plot_comm_timeline(intervals, path=None, title='one DDP step, rank 0'):
    """Draw backward, gradient computations and allreduces on one time axis (ms); save a PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no auto-display
    t0 = min(e[1] for e in intervals)

    def spans(prefix):
        return [((e[1] - t0) / 1e3, max((e[2] - e[1]) / 1e3, 0.02)) for e in intervals
                if e[0].startswith(prefix)]

    fig = Figure(figsize=(7, 2.6))
    ax = fig.subplots()
    ax.broken_barh(spans('backward'), (-0.35, 0.7), color='lightgray')
    ax.broken_barh(spans('autograd::engine'), (0.65, 0.7), color='tab:blue')
    ax.broken_barh(spans('c10d::allreduce_'), (1.65, 0.7), color='tab:orange')
    work = spans('nccl kernel') or spans(('gloo:all_reduce', 'nccl:all_reduce'))
    for i, span in enumerate(work):  # one thin lane per bucket: they overlap each other
        ax.broken_barh([span], (2.65 + 0.7 * i / len(work), 0.7 / len(work)), color='tab:red')
    ax.set_yticks(range(4), ['backward()', 'gradients (autograd)', 'allreduce launched',
                             'allreduce work (gloo / NCCL kernel)'])
    ax.set_xlabel('time since the step began (ms)')
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig
