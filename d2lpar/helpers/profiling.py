"""A DDP step's profile read and drawn (notebook 7): when gradients were ready, when allreduces ran."""

from pathlib import Path

from ..machinery.saving import replace_whole

__all__ = ['profile_intervals', 'overlap_report', 'plot_comm_timeline']


def profile_intervals(
    prof,
    names=(
        'backward',
        'autograd::engine::evaluate_function',
        'c10d::allreduce_',
        'gloo:all_reduce',
        'nccl:all_reduce',
        'step',
    ),
):
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
            found.append((event.name, event.time_range.start, event.time_range.end, int(event.thread)))
        elif event.device_type == DeviceType.CUDA and event.name.startswith('nccl') and 'Kernel' in event.name:
            found.append(('nccl kernel', event.time_range.start, event.time_range.end, int(event.thread)))
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
        work = [e for e in intervals if e[0] == 'nccl kernel' and start <= e[1] < until] or [
            e for e in inside if e[0] in ('gloo:all_reduce', 'nccl:all_reduce')
        ]
        if not grads or not (launches or work):
            continue
        last_grad = max(grads, key=lambda e: e[1])
        grad_end = max(e[2] for e in grads)
        overlap = sum(max(0.0, min(w[2], grad_end) - w[1]) for w in work)
        report.append(
            {
                'step': name,
                'grads': len(grads),
                'allreduces': len(launches or work),
                'last_grad_start': last_grad[1] - start,
                'grads_end': grad_end - start,
                'first_launch': min(e[1] for e in launches or work) - start,
                'work_overlap_us': overlap,
            }
        )
    return report


def plot_comm_timeline(intervals, path=None, title='one DDP step, rank 0'):
    """Draw backward, gradient computations and allreduces on one time axis (ms); save a PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no auto-display

    t0 = min(e[1] for e in intervals)

    def spans(prefix):
        return [((e[1] - t0) / 1e3, max((e[2] - e[1]) / 1e3, 0.02)) for e in intervals if e[0].startswith(prefix)]

    fig = Figure(figsize=(7, 2.6))
    ax = fig.subplots()
    ax.broken_barh(spans('backward'), (-0.35, 0.7), color='lightgray')
    ax.broken_barh(spans('autograd::engine'), (0.65, 0.7), color='tab:blue')
    ax.broken_barh(spans('c10d::allreduce_'), (1.65, 0.7), color='tab:orange')
    work = spans('nccl kernel') or spans(('gloo:all_reduce', 'nccl:all_reduce'))
    for i, span in enumerate(work):  # one thin lane per bucket: they overlap each other
        ax.broken_barh([span], (2.65 + 0.7 * i / len(work), 0.7 / len(work)), color='tab:red')
    ax.set_yticks(
        range(4), ['backward()', 'gradients (autograd)', 'allreduce launched', 'allreduce work (gloo / NCCL kernel)']
    )
    ax.set_xlabel('time since the step began (ms)')
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    if path is not None:  # written whole or not at all: a reader never sees half a picture
        replace_whole(path, lambda tmp: fig.savefig(tmp, format=Path(path).suffix[1:] or 'png', dpi=100))
    return fig
