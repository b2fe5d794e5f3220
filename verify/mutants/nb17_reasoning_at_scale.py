"""Planted bugs for notebook 17 (reasoning at scale), each tied to the check that must catch it."""

from verify.mutants.registry import Mutant

NB = '17_reasoning_at_scale'
SCALE = 'd2lpar/scale.py'
NOTEBOOK = 'notebooks/17_reasoning_at_scale.ipynb'
LESSON = 'd2lpar/lessons/nb17_reasoning_at_scale.py'  # generated from the notebook (make lib)
PREDICT_VS_FAKE = 'peak off by {error:+.1e}'
SAC_HEAD = '''def _selective_policy():
    \"\"\"torchtitan's 'op' selective checkpointing: save matmul and attention outputs, except every second matmul.\"\"\"
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

'''

MUTANTS = [
    Mutant(
        name='nb17-adam-one-moment',
        notebook=NB,
        claim='predicted memory equals the fake run',
        target=NOTEBOOK,
        old='optimizer=8 * shard',
        new='optimizer=4 * shard',
        catch='assert abs(error) < 1e-3, error',
        quick=True,
    ),
    Mutant(
        name='nb17-blocks-gathered-once',
        notebook=NB,
        claim='predicted bytes equal the fake run',
        target=NOTEBOOK,
        old="2 * (fsdp - 1) * (2 * shard - root)",
        new='2 * (fsdp - 1) * shard',
        catch="assert all(abs(p['sent'][k] - r['sent'][k]) <= 1e-9",
    ),
    Mutant(
        name='nb17-no-flash-recompute',
        notebook=NB,
        claim='hardware FLOPs equal the FLOP counter',
        target=NOTEBOOK,
        old='2 * layers * (redo + dim * seq_len)',
        new='2 * layers * redo',
        catch="(p['hardware_flops'], r['flops'])",
    ),
    Mutant(
        name='nb17-measure-first-step',
        notebook=NB,
        claim='the fake run measures a step with optimizer state',
        target=SCALE,
        old='            step()\n            memory, flops, comm',
        new='            memory, flops, comm',
        catch=PREDICT_VS_FAKE,
    ),
    Mutant(
        name='nb17-sp-activations-not-split',
        notebook=NB,
        claim='a sequence-parallel block keeps 1/tp of its input',
        target=NOTEBOOK,
        old='tokens = local_batch * seq_len / tp  #',
        new='tokens = local_batch * seq_len  #',
        catch="assert block70['flops'] == grow('hardware_flops') and abs(block70['peak act']",
    ),
    Mutant(
        name='nb17-embedding-in-model-flops',
        notebook=NB,
        claim="MFU from the table reproduces torchtitan's 33% to 39%",
        target='notebooks/17_reasoning_at_scale.ipynb',
        old="mfu = {name: check_mfu(per_token * tps / H100['peak'])",
        new="mfu = {name: check_mfu((per_token + 6 * cfg8['vocab'] * cfg8['dim']) * tps / H100['peak'])",
        catch="round(100 * mfu['eager']) == 34",
    ),
    Mutant(
        name='nb17-check-mfu-no-mamf',
        notebook=NB,
        claim='an MFU above MAMF is refused',
        target=LESSON,
        old="    if mfu > gpu['mamf'] / gpu['peak']:",
        new='    if False:',
        catch='tests/test_scale.py::test_check_mfu_refuses_the_impossible',
        run='tests/test_scale.py::test_check_mfu_refuses_the_impossible',
    ),
    Mutant(
        name='nb17-communication-free',
        notebook=NB,
        claim='the 128-GPU throughput lies between hidden and exposed communication',
        target=NOTEBOOK,
        old='comm, tp_s = sum(fsdp.values()) / link',
        new='comm, tp_s = 0 * sum(fsdp.values()) / link',
        catch="assert exposed <= published[128]['tps'] <= hidden",
    ),
    Mutant(
        name='nb17-bubble-ignores-interleaving',
        notebook=NB,
        claim='interleaving shrinks the bubble as published',
        target=NOTEBOOK,
        old='(m + (pp - 1) / stages_per_rank) / m',
        new='(m + (pp - 1)) / m',
        catch='assert 1 < reported_gain <= gain',
        quick=True,
    ),
    Mutant(
        name='nb17-world-wrong-shard',
        notebook=NB,
        claim='one process equals four real processes',
        target='notebooks/17_reasoning_at_scale.ipynb',
        old='lambda t: t.chunk(n)[rank])',
        new='lambda t: t.chunk(n)[(rank + 1) % n])',
        catch="assert [real[r]['loss'] for r in range(n)] == local['losses']",
    ),
    Mutant(
        name='nb17-world-no-average',
        notebook=NB,
        claim='one process equals four real processes (gradients)',
        target='notebooks/17_reasoning_at_scale.ipynb',
        old="    loss, own, grads = data_parallel_step(X, y, lambda t: t.chunk(n)[rank])",
        new="    loss, own, grads = data_parallel_step(X, y, lambda t: t.chunk(n)[rank])\n    grads = [g * n for g in grads]",
        catch='assert (error <= (n - 1) * eps * bound / n).all()',
    ),
    Mutant(
        name='nb17-largest-batch-off-by-one',
        notebook=NB,
        claim='the checker refuses a batch that does not fit',
        target='d2lpar/exercises/reasoning_at_scale.py',
        old='        if got > best:',
        new='        if got > best + 1:',
        catch='tests/test_scale.py::test_largest_batch_wrong_answers_get_their_hint',
        run='tests/test_scale.py::test_largest_batch_wrong_answers_get_their_hint',
    ),
    Mutant(
        name='nb17-fit-first-step',
        notebook=NB,
        claim='the fake run equals real processes, byte for byte',
        target='notebooks/17_reasoning_at_scale.ipynb',
        old="step()  # the optimizer's state exists from now on\n",
        new='',
        catch="assert all(fit[r]['peak'] == fake['peak']['total'] for r in (0, 1))",
    ),
    Mutant(
        name='nb17-block-without-norms',
        notebook=NB,
        claim="the parameter count is Llama 3.1 8B's published one",
        target=NOTEBOOK,
        old="+ 3 * d * cfg['hidden'] + 2 * d  # wq",
        new="+ 3 * d * cfg['hidden']  # wq",
        catch='assert blocks + rest == 8_030_261_248',
    ),
    Mutant(
        name='nb17-full-ac-recomputes-no-attention',
        notebook=NB,
        claim='hardware FLOPs are exact under full checkpointing too',
        target=NOTEBOOK,
        old="'full': 2 * dim * (dim + kv + hidden + seq_len)}",
        new="'full': 2 * dim * (dim + kv + hidden)}",
        catch="abs(p['peak'] / r['peak']['total'] - 1) < 1e-3, ac",
    ),
    Mutant(
        name='nb17-full-ac-recomputes-w2',
        notebook=NB,
        claim='hardware FLOPs are exact under full checkpointing too',
        target=NOTEBOOK,
        old="'full': 2 * dim * (dim + kv + hidden + seq_len)}",
        new="'full': 2 * dim * (dim + kv + hidden + seq_len) + dim * hidden}",
        catch=PREDICT_VS_FAKE,
    ),
    Mutant(
        name='nb17-sp-recompute-ignored',
        notebook=NB,
        claim="sequence parallelism's bytes per block equal the fake run",
        target=NOTEBOOK,
        old="{'all-gather': (4 + 2 * (ac == 'full')) * one",
        new="{'all-gather': 4 * one",
        catch="assert abs(block70[f'sent {k}'] / (p2['sent'][k] - p1['sent'][k]) - 1) < 1e-5, k",
    ),
    Mutant(
        name='nb17-propagation-counted',
        notebook=NB,
        claim="the fake run counts no DTensor shape-propagation placeholder as memory",
        target=SCALE,
        old='with memory, flops, comm, _propagation_unseen():',
        new='with memory, flops, comm:',
        catch="assert one70['peak temp'] <= p1['memory']['loss']",
    ),
    Mutant(
        name='nb17-sac-one-counter-for-all-blocks',
        notebook=NB,
        claim='every block of a fake run adds the same bytes, to the byte (the model scales by arithmetic)',
        target=SCALE,
        old=SAC_HEAD + '    count = defaultdict(int)\n',
        new=SAC_HEAD.replace('():', '(count=defaultdict(int)):'),  # one counter, shared by every block
        catch='assert grow == step, (a, b, grow, step)',
    ),
    Mutant(
        name='nb17-extrapolate-one-block-too-many',
        notebook=NB,
        claim='the fake runs, scaled to 32 blocks, count the FLOPs the predictor does',
        target=NOTEBOOK,
        old="full8 = {k: one8[k] + (cfg8['n_layers'] - 1) * block8[k] for k in one8}",
        new="full8 = {k: one8[k] + cfg8['n_layers'] * block8[k] for k in one8}",
        catch="assert abs(full8['flops'] - p8['hardware_flops']) <= 1e-9 * full8['flops']",
    ),
    Mutant(
        name='nb17-published-memory-digits-swapped-8',
        notebook=NB,
        claim="the predicted peak (live tensors) lies below torchtitan's reserved memory",
        target=SCALE,
        old="'selective', 5762, 82.4)",
        new="'selective', 5762, 28.4)",
        catch="assert pred[g]['peak'] / GiB <= published[g]['memory_gib']",
    ),
    Mutant(
        name='nb17-published-memory-digits-swapped-128',
        notebook=NB,
        claim='sharding over 128 GPUs explains most, not all, of the published saving',
        target=SCALE,
        old="'selective', 5605, 67.0)",
        new="'selective', 5605, 76.0)",
        catch='assert 0 < saved < reported',
    ),
    Mutant(
        name='nb17-loss-not-split-over-tp',
        notebook=NB,
        claim="the loss head's memory, which the fake run cannot see apart, is bounded by the prediction",
        target=NOTEBOOK,
        old="loss=local_batch * seq_len * (12 * cfg['vocab'] + 10 * dim) / tp)",
        new="loss=local_batch * seq_len * (12 * cfg['vocab'] + 10 * dim))",
        catch="assert p1['memory']['loss'] < head < 1.5 * p1['memory']['loss']",
    ),
    Mutant(
        name='nb17-mamf-of-the-host',
        notebook=NB,
        claim='the published 8-GPU throughput stays below the MAMF ceiling',
        target=NOTEBOOK,
        old="compute = hardware_flops / (efficiency * gpu['mamf'])",
        new="compute = hardware_flops / (efficiency * gpu['mamf'] / gpu['gpus_per_host'])",
        catch="assert published[8]['tps'] <= ceiling['tps']",
    ),
    Mutant(
        name='nb17-world-broadcasts-the-batch',
        notebook=NB,
        claim='one process sees every collective the real processes make',
        target=NOTEBOOK,
        old='with CommDebugMode() as comm:\n    loss, own, grads = data_parallel_step(X, y, lambda t: t.chunk(n)[rank])',
        new=(
            "with CommDebugMode() as comm:\n    dist.broadcast(X, 0)  # rank 0's batch, on every rank\n"
            '    loss, own, grads = data_parallel_step(X, y, lambda t: t.chunk(n)[rank])'
        ),
        catch="assert all(real[r]['calls'] == local['calls'] for r in range(n))",
    ),
    Mutant(
        name='nb17-head-dim-128',
        notebook=NB,
        claim='the predictor, checked on Llama 8B, is right on another model run for real',
        target=NOTEBOOK,
        old="    kv = dim // cfg['n_heads'] * cfg['n_kv_heads']\n    return dict(params=",
        new="    kv = 128 * cfg['n_kv_heads']  # Llama's heads are 128 wide\n    return dict(params=",
        catch="assert abs(predicted / fit[0]['peak'] - 1) < 1e-3",
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = []
