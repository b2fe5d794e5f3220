"""Checking and drawing a pipeline schedule (notebooks 4 and 13): schedule_problems, plot_schedule.

A schedule is a list of events (stage, micro-batch, 'F' or 'B', start, end), as
d2lpar.pipeline_schedule computes it and a gpipe_step or a torch pipeline schedule records it.
"""

from ..checks import checked, positive_int
from ..checks.nb04_model_parallel import _check_schedule_problems, _events

__all__ = ['schedule_problems', 'plot_schedule']


@checked(_check_schedule_problems)
def schedule_problems(events, num_stages, num_microbatches):
    """Return what is wrong with a pipeline schedule (an empty list if nothing).

    Checks that every task runs once on a stage that exists, that no task ends
    before it starts, that no stage runs two tasks at a time, and that no task
    starts before its input was ready.
    """
    tasks = {}
    problems = []
    for i, j, phase, start, end in events:
        if i >= num_stages or j >= num_microbatches:
            problems.append(
                f'{phase}{j} runs on stage {i}, outside the {num_stages} stages '
                f'and {num_microbatches} micro-batches of this schedule'
            )
        if end < start:
            problems.append(f'{phase}{j} on stage {i} ends at {end:.6g}, before it starts at {start:.6g}')
        if (i, j, phase) in tasks:
            problems.append(f'{phase}{j} runs twice on stage {i}')
        tasks[(i, j, phase)] = (start, end)
    expected = {(i, j, ph) for i in range(num_stages) for j in range(num_microbatches) for ph in 'FB'}
    problems += [f'{ph}{j} never runs on stage {i}' for i, j, ph in sorted(expected - set(tasks))]
    for i in range(num_stages):
        spans = sorted(v for (s, _, _), v in tasks.items() if s == i)
        problems += [f'stage {i} runs two tasks at once at {b[0]:.6g}' for a, b in zip(spans, spans[1:]) if b[0] < a[1]]
    for (i, j, ph), (start, _) in tasks.items():
        sources = [(i - 1, j, 'F')] if ph == 'F' else [(i + 1, j, 'B'), (i, j, 'F')]
        for source in sources:
            if source in tasks and start < tasks[source][1]:
                problems.append(f'{ph}{j} starts on stage {i} before {source[2]}{j} of stage {source[0]} ended')
    return problems


def plot_schedule(events, num_stages, ax=None, title=None, unit='time step'):
    """Draw a pipeline schedule as a Gantt chart: one row per stage, one box per task."""
    events = _events(events, 'plot_schedule')
    positive_int(num_stages, 'plot_schedule: num_stages')
    if not events:
        raise ValueError(
            'plot_schedule: no events to draw; pass the events of d2lpar.pipeline_schedule or of a gpipe_step'
        )
    if ax is None:
        from matplotlib.figure import Figure

        ax = Figure(figsize=(7, 0.45 * num_stages + 1)).add_subplot()
    import matplotlib

    colors = matplotlib.colormaps['tab10']
    span = max(e[4] for e in events) - min(e[3] for e in events)
    for i, j, phase, start, end in events:
        ax.barh(
            i,
            end - start,
            left=start,
            height=0.8,
            color=colors(j % 10),
            alpha=1.0 if phase == 'F' else 0.55,
            hatch=None if phase == 'F' else '//',
            edgecolor='black',
            linewidth=0.5,
        )
        if end - start > span / 40:
            ax.text((start + end) / 2, i, f'{phase}{j}', ha='center', va='center', fontsize=7)
    ax.set_yticks(range(num_stages), [f'stage {i}' for i in range(num_stages)])
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    if title:
        ax.set_title(title, fontsize=10)
    ax.figure.tight_layout()
    return ax.figure
