"""Planted bugs for notebook 4, splitting the model."""

from verify.mutants.registry import Mutant

NB = '04_model_parallel'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant(
        'micro-batches-not-scaled',
        NB,
        "GPipe's gradients equal the whole batch's",
        FILE,
        old='l = loss(out, ys[j].to(out.device)) * (len(ys[j]) / len(X))',
        new='l = loss(out, ys[j].to(out.device))',
        catch='torch.testing.assert_close(grads(model), expected, **close)',
        quick=True,
    ),
    Mutant(
        'bubble-formula-off-by-one',
        NB,
        'the bubble is (p-1)/(m+p-1)',
        FILE,
        old='return (num_stages - 1) / (num_microbatches + num_stages - 1)',
        new='return (num_stages - 1) / (num_microbatches + num_stages)',
        catch='assert abs(idle_fraction(events, p) - bubble_fraction(p, m)) < 1e-12',
    ),
    Mutant(
        'stage-starts-before-its-input',
        NB,
        'a stage waits for its input',
        FILE,
        old="done.get(source, math.inf) > tick:",
        new="done.get(source, math.inf) > tick + 1:",
        catch='assert max(e[4] for e in events) == 2 * (m + p - 1)',
    ),
    Mutant(
        'group-gradients-not-summed',
        NB,
        'data parallel over model-parallel groups sums gradients',
        FILE,
        old="total = sum(p.grad.to('cpu') for p in same_param)",
        new="total = same_param[0].grad.to('cpu')",
        catch='torch.testing.assert_close(grads(group), expected, **close)',
    ),
    Mutant(
        'stages-share-the-callers-weights',
        NB,
        'ModelParallel splits a copy',
        FILE,
        old='layers, start = list(copy.deepcopy(net)), 0',
        new='layers, start = list(net), 0',
        catch='assert all(p.data_ptr() != q.data_ptr() for p, q in zip(model.parameters(), net.parameters()))',
    ),
    Mutant(
        'gpipe-without-micro-batches',
        NB,
        'GPipe is faster than the naive split',
        FILE,
        old="    for name, chunks in [('naive split', 1), ('GPipe', m)]:\n        start",
        new="    for name, chunks in [('naive split', 1), ('GPipe', 1)]:\n        start",
        catch='assert speedup > 1 + noise',
    ),
    Mutant(
        'one-thread-gpipe-unscaled',
        NB,
        'one thread in schedule order computes what the threads do',
        FILE,
        old='out = loss(out, ys[j].to(device)) * (len(ys[j]) / len(X))',
        new='out = loss(out, ys[j].to(device))',
        catch='torch.testing.assert_close(grads(model), threaded_grads, rtol=0, atol=0)',
    ),
]

MUTANTS += [
    Mutant(
        'replica-copies-detached',
        NB,
        'split data: same gradients as the unsplit network',
        'd2lpar/lessons/nb03_data_parallel.py',
        old='name: t.to(device, copy=True) for name, t in originals.items()}',
        new='name: t.detach().to(device, copy=True) for name, t in originals.items()}',
        catch="torch.testing.assert_close(grads(dp_net), expected, **close)",
    ),
    Mutant(
        'one-group-not-stepped',
        NB,
        'after one step both groups hold the unsplit network\'s parameters',
        FILE,
        old='for module in [reference, *groups]:',
        new='for module in [reference, groups[0]]:',
        catch='torch.testing.assert_close([p.detach().cpu() for p in group.parameters()],',
    ),
    Mutant(
        'wide-gradients-not-zeroed',
        NB,
        'every timed run computes the unsplit gradients',
        FILE,
        old='            stages.zero_grad()\n',
        new='',
        catch='torch.testing.assert_close(grads(stages), wide_expected, rtol=1e-4, atol=1e-5)',
    ),
    Mutant(
        'clock-misses-backward',
        NB,
        'backward takes longer than forward',
        FILE,
        old="        with link.clock(i, j, 'B'):\n            x, out = kept.pop()\n            out.backward(grad)",
        new="        x, out = kept.pop()\n        out.backward(grad)\n        with link.clock(i, j, 'B'):\n"
        "            pass",
        catch="assert phase_time['B'] > phase_time['F']",
    ),
    Mutant(
        'adam-counted-as-one-state',
        NB,
        'Adam keeps two tensors per parameter',
        'd2lpar/helpers/footprint.py',
        old="'optimizer': optimizer_states * param_bytes",
        new="'optimizer': param_bytes",
        catch="assert mem[8]['optimizer'] == 2 * mem[8]['parameters']",
    ),
    Mutant(
        'weights-counted-as-activations',
        NB,
        'activations grow linearly with the batch',
        'd2lpar/helpers/footprint.py',
        old='saved_bytes(net, X, exclude=params)',
        new='saved_bytes(net, X, exclude=[])',
        catch="assert mem[16]['activations'] == 2 * mem[8]['activations']",
    ),
    Mutant(
        'weights-only-no-adam',
        NB,
        'training needs 16 bytes per parameter with Adam',
        FILE,
        old='return params, 16 * params + activations',
        new='return params, 4 * params + activations',
        catch='assert total > device_memory and stages_needed >= 2 and total / stages_needed <= device_memory',
    ),
    Mutant(
        'stages-rounded-down',
        NB,
        'an even split must fit on each device: round the stages up',
        FILE,
        old='stages_needed = int(-(-total // device_memory))',
        new='stages_needed = int(total // device_memory)',
        catch='assert total > device_memory and stages_needed >= 2 and total / stages_needed <= device_memory',
    ),
]

MUTANTS += [
    Mutant(
        'stages-called-past-their-hooks',
        NB,
        "stage 0 gets the batch, every later stage only the previous stage's activations",
        FILE,
        old='X = stage(X.to(device))',
        new='X = stage.forward(X.to(device))',
        catch='assert given == [tuple(X.shape), (len(X), 256)]',
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = [
    "assert [len(stage) for stage in model.stages] == [5, 4]  # 9 layers: as even as possible",
    "torch.testing.assert_close(model(X).cpu(), net(X), **exact)",
    "torch.testing.assert_close(split_grads, expected, **exact)",
    "torch.testing.assert_close(split_loss, expected_loss, **exact)",
    "assert abs(sum(group_losses) - expected_loss) < 1e-5",
    "assert d2lpar.schedule_problems(events, p, m) == []",
    "assert abs(got_loss - expected_loss) < 1e-5",
    "assert d2lpar.schedule_problems(events, len(model.stages), chunks) == []",
    "assert one_thread_loss == threaded_loss",
    "assert d2lpar.schedule_problems(events, p, m) == []",
    "assert plans[4, 1024][1] == 1",
]
