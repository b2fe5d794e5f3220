"""Planted bugs of notebook 14 (pipeline schedules, 3D) and the checks that catch them."""

from verify.mutants.registry import Mutant

NB = '14_pipeline_parallel'
TARGET = 'notebooks/14_pipeline_parallel.ipynb'

MUTANTS = [
    Mutant(
        name='microbatches-not-scaled',
        notebook=NB,
        quick=True,
        claim='every schedule computes the gradients of one process',
        target=TARGET,
        old="n_microbatches=m, loss_fn=nn.CrossEntropyLoss())",
        new="n_microbatches=m, loss_fn=nn.CrossEntropyLoss(), scale_grads=False)",
        catch='torch.testing.assert_close(got, unsplit)',
    ),
    Mutant(
        name='1f1b-runs-gpipe',
        notebook=NB,
        claim="1F1B's order: p - i forwards, then one backward, one forward",
        target=TARGET,
        old="'1F1B': (Schedule1F1B, 1, lambda r: [r]),",
        new="'1F1B': (ScheduleGPipe, 1, lambda r: [r]),",
        catch="assert order['1F1B'] == one_f_one_b",
    ),
    Mutant(
        name='replay-backward-not-waiting-for-next-stage',
        notebook=NB,
        claim="the replayed bubble equals (p-1)/(vm+p-1)",
        target=TARGET,
        old="done.get((i + 1, j, 'B'), 0), done.get((i + 1, j, 'I'), 0))",
        new="done.get((i + 1, j, 'F'), 0), done.get((i + 1, j, 'I'), 0))",
        catch='assert abs(ideal - formula) < 1e-9',
    ),
    Mutant(
        name='bubble-formula-ignores-v',
        notebook=NB,
        claim="interleaving v stages divides the bubble: (p-1)/(vm+p-1)",
        target=TARGET,
        old='return (p - 1) / (v * m + p - 1)',
        new='return (p - 1) / (m + p - 1)',
        catch='assert abs(ideal - formula) < 1e-9',
    ),
    Mutant(
        name='zero-bubble-first-stage-drawn-as-I-and-W',
        notebook=NB,
        claim="torch runs stage 0's whole backward in the W slot (zero-bubble)",
        target=TARGET,
        old='        if stage.is_first:  # its I was skipped: the whole backward runs now',
        new='        if False:  # its I was skipped: the whole backward runs now',
        catch="assert sorted(order[name]) == sorted(forwards + [f'B{j}' for j in range(m)]), order[name]",
    ),
    Mutant(
        name='in-flight-freed-at-input-pass',
        notebook=NB,
        claim='zero-bubble schedules hold activations until the W pass',
        target=TARGET,
        old="in_flight = pp_steps.InFlight(modules, stages, split='Zero' in name)",
        new="in_flight = pp_steps.InFlight(modules, stages, split=False)",
        catch='assert peaks == [held(r, name) for r in range(p)], (name, peaks)',
    ),
    Mutant(
        name='3d-dp-halves-same-data',
        notebook=NB,
        claim='pp x dp x tp on 8 processes = one process',
        target=TARGET,
        old='        schedule.step(X.chunk(2)[dp])',
        new='        schedule.step(X.chunk(2)[0])',
        catch="assert r['max_diff'] < tolerance < r['moved'] / 100, (rank, r['max_diff'], tolerance)",
    ),
]
