"""Planted bugs for notebook 4, splitting the model."""
from verify.mutants.registry import Mutant

NB = '04_model_parallel'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant('micro-batches-not-scaled', NB, "GPipe's gradients equal the whole batch's", FILE,
           old='l = loss(out, ys[j].to(out.device)) * (len(ys[j]) / len(X))',
           new='l = loss(out, ys[j].to(out.device))',
           catch='torch.testing.assert_close(grads(model), expected, **close)', quick=True),
    Mutant('bubble-formula-off-by-one', NB, 'the bubble is (p-1)/(m+p-1)', FILE,
           old='return (num_stages - 1) / (num_microbatches + num_stages - 1)',
           new='return (num_stages - 1) / (num_microbatches + num_stages)',
           catch='assert abs(idle_fraction(events, p) - bubble_fraction(p, m)) < 1e-12'),
    Mutant('stage-starts-before-its-input', NB, 'a stage waits for its input', FILE,
           old="done.get(source, math.inf) > tick:", new="done.get(source, math.inf) > tick + 1:",
           catch='assert max(e[4] for e in events) == 2 * (m + p - 1)'),
    Mutant('group-gradients-not-summed', NB, 'data parallel over model-parallel groups sums gradients', FILE,
           old="total = sum(p.grad.to('cpu') for p in same_param)",
           new="total = same_param[0].grad.to('cpu')",
           catch='torch.testing.assert_close(grads(group), expected, **close)'),
    Mutant('stages-share-the-callers-weights', NB, 'ModelParallel splits a copy', FILE,
           old='layers, start = list(copy.deepcopy(net)), 0', new='layers, start = list(net), 0',
           catch='assert all(p.data_ptr() != q.data_ptr() for p, q in zip(model.parameters(), net.parameters()))'),
    Mutant('gpipe-without-micro-batches', NB, 'GPipe is faster than the naive split', FILE,
           old="    for name, chunks in [('naive split', 1), ('GPipe', m)]:\n        start",
           new="    for name, chunks in [('naive split', 1), ('GPipe', 1)]:\n        start",
           catch='assert speedup > 1 + noise'),
]
