"""Planted bugs of notebook 17 (the capstone) and the checks that catch them."""
from verify.mutants.registry import Mutant

NB = '17_capstone'
TARGET = 'notebooks/17_capstone.ipynb'
PARITY = 'assert loss_gap[name] <= tol_loss and param_gap[name] <= tol_param, name'

MUTANTS = [
    Mutant(name='pipeline-stage-keeps-embedding', notebook=NB, quick=True,
           claim='a pipeline stage keeps only its share (the embedding on the first stage)',
           target=TARGET, old='    if stage > 0:\n        net.embed = None', new='    if stage > 1:\n        net.embed = None',
           catch="assert list(stage_1.blocks) == ['1'] and stage_1.embed is None and 'head' in plan"),
    Mutant(name='dp-gradients-summed-not-averaged', notebook=NB,
           claim='every correct layout = one process (dp averaged)',
           target=TARGET, old="divide='dp_average' not in broken)", new='divide=False)',
           catch=PARITY),
    Mutant(name='pp-microbatches-not-scaled', notebook=NB,
           claim='every correct layout = one process (micro-batches averaged)',
           target=TARGET, old="scale_grads='pp_scale' not in broken)", new='scale_grads=False)', catch=PARITY),
    Mutant(name='cp-gradients-not-averaged', notebook=NB,
           claim='every correct layout = one process (cp averaged)',
           target=TARGET, old="average_gradients(net, mesh['cp'].get_group(), layout['cp'])",
           new="average_gradients(net, mesh['cp'].get_group(), layout['cp'], divide=False)", catch=PARITY),
    Mutant(name='cp-ring-turns-the-wrong-way', notebook=NB,
           claim='every correct layout = one process (ring attention at cp = 4)',
           target='d2lpar/lessons/nb14_context_expert.py', old='        src = (rank - step) % n  # whose keys and values we hold now',
           new='        src = (rank + step) % n  # whose keys and values we hold now', catch=PARITY),
    Mutant(name='gradients-reduced-in-float32', notebook=NB,
           claim='every correct layout = one process in float64 too',
           target=TARGET, old='            dist.all_reduce(grad, group=group)\n',
           new='            low = grad.float()\n            dist.all_reduce(low, group=group)\n            grad.copy_(low)\n',
           catch='assert ratio <= 1, name'),
    Mutant(name='stepcost-misses-functional-all-reduce', notebook=NB,
           claim="StepCost counts every collective, DTensor's lazy all-reduces too (= CommDebugMode)",
           target=TARGET, old="'allreduce_': lambda n: 2 * (n - 1) / n, 'all_reduce': lambda n: 2 * (n - 1) / n,",
           new="'allreduce_': lambda n: 2 * (n - 1) / n,",
           catch="assert all({k: c for k, c in r[name]['calls'].items() if k != 'send'} == r[name]['collectives']"),
    Mutant(name='stepcost-misses-functional-all-reduce-package', notebook=NB, quick=True,
           claim="StepCost counts every collective, DTensor's lazy all-reduces too (= CommDebugMode)",
           target='d2lpar/lessons/nb17_capstone.py',  # generated from the notebook (make lib)
           old="'allreduce_': lambda n: 2 * (n - 1) / n, 'all_reduce': lambda n: 2 * (n - 1) / n,",
           new="'allreduce_': lambda n: 2 * (n - 1) / n,",
           run='tests/test_capstone.py::test_each_planted_bug_is_caught_and_each_correct_layout_is_not',
           catch='tests/test_capstone.py::test_each_planted_bug_is_caught_and_each_correct_layout_is_not'),
    Mutant(name='tolerance-ten-times-too-loose', notebook=NB,
           claim='the check catches step errors down to 1e-4',
           target=TARGET, old='tol_loss, tol_param = 2 * delta_loss, 2 * delta_param',
           new='tol_loss, tol_param = 2000 * delta_loss, 2000 * delta_param',
           catch='assert sensitivity[scales[0]] > 1 >= sensitivity[scales[-1]] and smallest <= 1e-4'),
]
