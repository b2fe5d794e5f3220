"""Exercise checkers: each accepts its reference solution and rejects typical wrong answers with the right hint.

The reference solutions are read from notebooks/solutions/ (the cells tagged
`solution`), so the tests check the very code instructors hand out.
"""
import ast
import contextlib
import io
import json
import math
import random
import re
from pathlib import Path

import pytest
import torch

import d2lpar
import d2lpar.distributed
from d2lpar import exercises

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
SEEDS = range(5)

# checker -> (solutions notebook, name defined there)
CHECKS = {
    exercises.check_pick_device: ('01_single_device', 'pick_device'),
    exercises.check_visible_count: ('02_visible_devices', 'predict_device_count'),
    exercises.check_load_checkpoint: ('03_data_parallel', 'load_checkpoint'),
    exercises.check_unbalanced_bubble: ('04_model_parallel', 'unbalanced_bubble'),
    exercises.check_sampler: ('05_ddp', 'UnpaddedSampler'),
    exercises.check_ring_allreduce: ('08_lenet_data_parallel', 'ring_allreduce'),
    exercises.check_split_batch: ('08_lenet_data_parallel', 'split_batch'),
    exercises.check_broadcast_schedule: ('09_collectives', 'broadcast_schedule'),
    exercises.check_zero2_hook: ('10_zero', 'zero2_hook'),
    exercises.check_shard_rows: ('11_fsdp2', 'shard_rows'),
    exercises.check_slurm_ranks: ('06_ddp_launching', 'slurm_ranks'),
    exercises.check_accumulation: ('07_ddp_practice', 'accumulate_uneven'),
    exercises.check_row_parallel_linear: ('12_tensor_parallel', 'row_parallel_linear'),
    exercises.check_interleaved_stages: ('13_pipeline_parallel', 'interleaved_stages'),
    exercises.check_online_softmax_merge: ('14_context_expert', 'merge_partial'),
    exercises.check_largest_batch: ('16_reasoning_at_scale', 'largest_batch'),
    exercises.check_choose_layout: ('17_capstone', 'choose_layout'),
    exercises.check_checkpoint_interval: ('15_fault_tolerance', 'checkpoint_interval'),
}


def cells(path, tag=None):
    """Return the code cells of a notebook (only those tagged `tag`, if given) as sources."""
    nb = json.loads(path.read_text())
    return [''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'code'
            and (tag is None or tag in c.get('metadata', {}).get('tags', []))]


def solution(chapter, name):
    namespace = {}
    sources = cells(NOTEBOOKS / 'solutions' / f'{chapter}_solutions.ipynb', 'solution')
    assert sources, f'{chapter}_solutions.ipynb has no cell tagged "solution"'
    for source in sources:
        exec(compile(source, f'{chapter}_solutions', 'exec'), namespace)
    return namespace[name]


def ids(check):
    return check.__name__


@pytest.mark.parametrize('check', CHECKS, ids=ids)
def test_reference_solution_passes(check):
    fn = solution(*CHECKS[check])
    for seed in SEEDS:
        verdict = check(fn, seed=seed)
        assert verdict.passed and verdict.attempted, verdict
        assert verdict.status == 'passed' and 'passed' in str(verdict)


def stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize('check', CHECKS, ids=ids)
def test_stub_is_not_attempted(check):
    verdict = check(stub)
    assert not verdict.passed and not verdict.attempted, verdict
    assert 'not attempted yet' in str(verdict)


@pytest.mark.parametrize('check', CHECKS, ids=ids)
def test_a_function_that_raises_becomes_the_verdict(check):
    def broken(*args, **kwargs):
        raise ZeroDivisionError('oops in the learner code')

    verdict = check(broken)
    assert not verdict.passed and verdict.attempted
    assert 'ZeroDivisionError: oops in the learner code' in verdict.message


@pytest.mark.parametrize('check', CHECKS, ids=ids)
@pytest.mark.parametrize('answer', [None, 42, object, lambda *a, **k: object(),
                                    lambda *a, **k: [[('x', 'y')]]])
def test_odd_answers_fail_without_raising(check, answer):
    verdict = check(answer)
    assert not verdict.passed and verdict.attempted and verdict.message, verdict


def test_a_failure_says_how_to_repeat_it():
    verdict = exercises.check_split_batch(drops_remainder, seed=123)
    assert 'seed=123' in verdict.message
    assert exercises.check_split_batch(drops_remainder, seed=123).message == verdict.message


def test_checking_leaves_the_global_random_state_alone():
    def draw():
        return torch.rand(3).tolist(), random.random()

    torch.manual_seed(0), random.seed(0)
    expected = draw()
    torch.manual_seed(0), random.seed(0)
    for check in CHECKS:
        check(solution(*CHECKS[check]))
    assert draw() == expected


def test_verdict_rejects_an_unknown_status():
    with pytest.raises(ValueError, match='status'):
        exercises.Verdict('x', 'maybe', '')


# ------------------------------------------------------------ wrong answers

def off_by_one(i, num_gpus):
    if 0 <= i <= num_gpus:
        return torch.device('cuda', i)
    raise ValueError(f'GPU {i} does not exist; there are {num_gpus}')


def falls_back_to_cpu(i, num_gpus):
    return torch.device('cuda', i) if 0 <= i < num_gpus else torch.device('cpu')


def accepts_negative(i, num_gpus):
    if i < num_gpus:
        return torch.device('cuda', i)
    raise ValueError(f'GPU {i} does not exist; there are {num_gpus}')


def unexplained(i, num_gpus):
    if isinstance(i, int) and 0 <= i < num_gpus:
        return torch.device('cuda', i)
    raise ValueError('bad index')


def names_only_the_index(i, num_gpus):
    if isinstance(i, int) and 0 <= i < num_gpus:
        return torch.device('cuda', i)
    raise ValueError(f'GPU {i!r} does not exist')


def counts_entries(mask, num_gpus):
    return num_gpus if mask is None else (0 if mask == '' else len(mask.split(',')))


def reads_digits_only(mask, num_gpus):
    """Count entries up to the first one that is not all digits (misses ' 1' and '1gpu')."""
    if mask is None:
        return num_gpus
    seen = []
    for entry in mask.split(','):
        if not entry.isdigit() or int(entry) >= num_gpus:
            break
        if int(entry) in seen:
            return 0
        seen.append(int(entry))
    return len(seen)


def no_range_check(mask, num_gpus):
    return num_gpus if mask is None else len(d2lpar.parse_visible_devices(mask))


def ignores_repeats(mask, num_gpus):
    if mask is None:
        return num_gpus
    seen = []
    for entry in mask.split(','):
        if not entry.isdigit() or int(entry) >= num_gpus:
            break
        seen.append(int(entry))
    return len(seen)


def no_strip_strict_false(net, state_dict):
    net.load_state_dict(state_dict, strict=False)


def strip_strict_false(net, state_dict):
    net.load_state_dict({k.removeprefix('module.'): v for k, v in state_dict.items()},
                        strict=False)


def strip_with_replace(net, state_dict):
    net.load_state_dict({k.replace('module.', ''): v for k, v in state_dict.items()})


def strip_with_lstrip(net, state_dict):
    net.load_state_dict({k.lstrip('module.'): v for k, v in state_dict.items()})


def always_strips(net, state_dict):
    net.load_state_dict({k[len('module.'):]: v for k, v in state_dict.items()})


class Padded(torch.utils.data.DistributedSampler):
    def __init__(self, dataset, num_replicas, rank, shuffle=True, seed=0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                         seed=seed)


class DropsLast(torch.utils.data.DistributedSampler):
    def __init__(self, dataset, num_replicas, rank, shuffle=True, seed=0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                         seed=seed, drop_last=True)


def sampler_variant(seed_of, epoch_used=True, blocks=False):
    """Return an unpadded sampler class with one mistake."""
    class Variant(torch.utils.data.Sampler):
        def __init__(self, dataset, num_replicas, rank, shuffle=True, seed=0):
            if not 0 <= rank < num_replicas:
                raise ValueError('bad rank')
            self.n, self.k, self.rank, self.shuffle, self.seed = (len(dataset), num_replicas,
                                                                  rank, shuffle, seed)
            self.epoch = 0

        def set_epoch(self, epoch):
            self.epoch = epoch

        def _mine(self):
            g = torch.Generator().manual_seed(seed_of(self) + (self.epoch if epoch_used else 0))
            order = (torch.randperm(self.n, generator=g).tolist() if self.shuffle
                     else list(range(self.n)))
            if blocks:  # contiguous blocks instead of DistributedSampler's strides
                bounds = [len(t) for t in torch.tensor_split(torch.arange(self.n), self.k)]
                start = sum(bounds[:self.rank])
                return order[start:start + bounds[self.rank]]
            return order[self.rank::self.k]

        def __iter__(self):
            return iter(self._mine())

        def __len__(self):
            return len(self._mine())
    return Variant


def reference_ring(add):
    """Return a ring allreduce whose reduce-scatter step does `add(dst_chunk, src_chunk)`."""
    def ring(data):
        n = len(data)
        chunks = [t.view(-1).tensor_split(n) for t in data]
        for step in range(n - 1):
            for i in range(n):
                c, dst = (i - step) % n, (i + 1) % n
                add(chunks[dst][c], chunks[i][c])
        for step in range(n - 1):
            for i in range(n):
                c, dst = (i + 1 - step) % n, (i + 1) % n
                chunks[dst][c].copy_(chunks[i][c])
    return ring


def aliases_replicas(data):
    total = sum(t.clone() for t in data)
    for i in range(len(data)):
        data[i] = total


def rebinds_entries(data):
    total = sum(t.clone() for t in data)
    for i in range(len(data)):
        data[i] = total.clone()


def assigns_to_local_name(data):
    total = sum(t.clone() for t in data)
    for t in data:
        t = total  # noqa: F841 (the mistake under test)


def sums_then_copies(data):
    total = sum(t.clone() for t in data)
    for t in data:
        t.copy_(total)


def averages(data):
    total = sum(t.clone() for t in data)
    for t in data:
        t.copy_(total / len(data))


def drops_remainder(X, y, devices):
    size = X.shape[0] // len(devices)
    return ([X[i * size:(i + 1) * size].to(d) for i, d in enumerate(devices)],
            [y[i * size:(i + 1) * size].to(d) for i, d in enumerate(devices)])


def uses_chunk(X, y, devices):
    return ([x.to(d) for x, d in zip(torch.chunk(X, len(devices)), devices)],
            [t.to(d) for t, d in zip(torch.chunk(y, len(devices)), devices)])


def forgets_to_move(X, y, devices):
    if X.shape[0] < len(devices):
        raise ValueError('too few rows')
    return list(torch.tensor_split(X, len(devices))), list(torch.tensor_split(y, len(devices)))


def allows_idle_devices(X, y, devices):
    return ([x.to(d) for x, d in zip(torch.tensor_split(X, len(devices)), devices)],
            [t.to(d) for t, d in zip(torch.tensor_split(y, len(devices)), devices)])


def unbalanced(times, m):
    return solution('04_model_parallel', 'unbalanced_bubble')(times, m)


def equal_stage_bubble(times, m):
    return (len(times) - 1) / (m + len(times) - 1)


def slowest_everywhere(times, m):
    return 1 - m * sum(times) / (len(times) * max(times) * (m + len(times) - 1))


def linear_one_round(n, src):
    return [[(src, d) for d in range(n) if d != src]] if n > 1 else []


def linear_rounds(n, src):
    return [[(src, d)] for d in range(n) if d != src]


def ignores_src(n, src):
    rounds, step = [], 1
    while step < n:
        rounds.append([(r, r + step) for r in range(step) if r + step < n])
        step *= 2
    return rounds


def powers_of_two_only(n, src):
    return [[((r + src) % n, (r + 2**k + src) % n) for r in range(2**k)]
            for k in range(int(math.log2(n)))]


def slurm_variant(**wrong):
    """Return the reference slurm_ranks with the fields in `wrong` computed another way."""
    def slurm_ranks(environ):
        right = solution('06_ddp_launching', 'slurm_ranks')(environ)
        return {**right, **{key: how(environ) for key, how in wrong.items()}}
    return slurm_ranks


def first_of_split(environ):
    return environ['SLURM_NODELIST'].split(',')[0]


def glued_digits(environ):
    return '.'.join(re.findall('[0-9]+', environ['SLURM_NODELIST']))


def unpadded_first(environ):
    first = solution('06_ddp_launching', 'slurm_ranks')(environ)['master_addr']
    return re.sub(r'(?<![0-9])0+(?=[0-9])', '', first)


def own_node(environ):
    hosts = d2lpar.distributed.expand_nodelist(environ['SLURM_NODELIST'])
    return hosts[int(environ['SLURM_NODEID'])]


def accepts_any_rank(environ):
    return {'rank': int(environ['SLURM_PROCID']), 'local_rank': int(environ['SLURM_LOCALID']),
            'world_size': int(environ['SLURM_NTASKS']),
            'master_addr': d2lpar.distributed.expand_nodelist(environ['SLURM_NODELIST'])[0]}


WRONG = [
    (exercises.check_pick_device, off_by_one, 'off-by-one'),
    (exercises.check_pick_device, falls_back_to_cpu, 'fell back to the CPU'),
    (exercises.check_pick_device, accepts_negative, 'negative indices'),
    (exercises.check_pick_device, unexplained, 'how many GPUs'),
    (exercises.check_pick_device, names_only_the_index, 'how many GPUs'),
    (exercises.check_visible_count, counts_entries, "'-1' is not a GPU"),
    (exercises.check_visible_count, no_range_check, 'the machine does not have'),
    (exercises.check_visible_count, ignores_repeats, 'listed twice'),
    (exercises.check_visible_count, reads_digits_only, 'strtoul'),
    (exercises.check_load_checkpoint, no_strip_strict_false, 'strict=False'),
    (exercises.check_load_checkpoint, no_strip_strict_false, 'nothing was loaded'),
    (exercises.check_load_checkpoint, strip_strict_false, 'strict=False silently ignores'),
    (exercises.check_load_checkpoint, strip_with_replace, ".replace('module.', '')"),
    (exercises.check_load_checkpoint, always_strips, "no 'module.' prefix"),
    (exercises.check_load_checkpoint, strip_with_lstrip, 'a set of characters'),
    (exercises.check_unbalanced_bubble, equal_stage_bubble, 'the slowest one sets the pace'),
    (exercises.check_unbalanced_bubble, slowest_everywhere, 'not p times the slowest'),
    (exercises.check_unbalanced_bubble, lambda t, m: 1 - unbalanced(t, m), 'busy share'),
    (exercises.check_unbalanced_bubble, lambda t, m: 100 * unbalanced(t, m), 'percentage'),
    (exercises.check_sampler, Padded, 'padding'),
    (exercises.check_sampler, DropsLast, 'served to no rank'),
    (exercises.check_sampler, sampler_variant(lambda s: s.seed + s.rank), 'same permutation'),
    (exercises.check_sampler, sampler_variant(lambda s: s.seed, epoch_used=False),
     'set_epoch had no effect'),
    (exercises.check_sampler, sampler_variant(lambda s: s.seed, blocks=True),
     "DistributedSampler's order"),
    (exercises.check_ring_allreduce, aliases_replicas, 'share memory'),
    (exercises.check_ring_allreduce, rebinds_entries, 'is a new tensor'),
    (exercises.check_ring_allreduce, assigns_to_local_name, 'unchanged'),
    (exercises.check_ring_allreduce, reference_ring(lambda dst, src: dst.copy_(src)),
     'assigned where it should be added'),
    (exercises.check_ring_allreduce, averages, 'mean'),
    (exercises.check_ring_allreduce, sums_then_copies, 'not computed by a ring'),
    (exercises.check_ring_allreduce, d2lpar.allreduce, 'the naive allreduce'),
    (exercises.check_split_batch, drops_remainder, 'instead of dropping them'),
    (exercises.check_split_batch, uses_chunk, 'torch.tensor_split'),
    (exercises.check_split_batch, forgets_to_move, 'move each part'),
    (exercises.check_split_batch, allows_idle_devices, 'fewer rows than devices'),
    (exercises.check_broadcast_schedule, linear_one_round, 'one link'),
    (exercises.check_broadcast_schedule, linear_rounds, 'holders double'),
    (exercises.check_broadcast_schedule, ignores_src, 'relative to the source'),
    (exercises.check_broadcast_schedule, powers_of_two_only, 'never get the data'),
    (exercises.check_slurm_ranks, slurm_variant(rank=lambda e: int(e['SLURM_NODEID'])),
     'SLURM_NODEID numbers the machines'),
    (exercises.check_slurm_ranks, slurm_variant(world_size=lambda e: int(e['SLURM_NNODES'])),
     'counts processes, not machines'),
    (exercises.check_slurm_ranks, slurm_variant(local_rank=lambda e: int(e['SLURM_PROCID'])),
     'SLURM_LOCALID'),
    (exercises.check_slurm_ranks, slurm_variant(rank=lambda e: e['SLURM_PROCID']), 'as an int'),
    (exercises.check_slurm_ranks, slurm_variant(master_addr=first_of_split), 'expand the node list'),
    (exercises.check_slurm_ranks, slurm_variant(master_addr=glued_digits), 'not IP addresses'),
    (exercises.check_slurm_ranks, slurm_variant(master_addr=unpadded_first), 'zero padding'),
    (exercises.check_slurm_ranks, slurm_variant(master_addr=own_node), "this task's own node"),
    (exercises.check_slurm_ranks, accepts_any_rank, 'was accepted'),
]


@pytest.mark.parametrize('check,answer,hint', WRONG,
                         ids=[f'{c.__name__}-{getattr(a, "__name__", "")}-{h}'
                              for c, a, h in WRONG])
def test_wrong_answer_fails_with_its_hint(check, answer, hint):
    for seed in SEEDS:
        verdict = check(answer, seed=seed)
        assert verdict.attempted and not verdict.passed, verdict
        assert hint in verdict.message, verdict


def test_chunk_that_runs_out_of_rows_is_explained():
    verdict = exercises.check_split_batch(
        lambda X, y, devices: (list(torch.chunk(X, len(devices))), list(torch.chunk(y, 4))))
    # 10 rows on 4 devices: chunk balances badly; 5 rows on 4: it makes only 3 parts.
    assert not verdict.passed and 'torch.tensor_split' in verdict.message


def test_the_tree_broadcast_is_the_fastest_possible():
    # The reference bound: holders can at most double per round.
    for n in range(1, 70):
        rounds = solution('09_collectives', 'broadcast_schedule')(n, 0)
        assert len(rounds) == (math.ceil(math.log2(n)) if n > 1 else 0)


def zero2_variant(divide=1, row=0, free=True, per_parameter=False, forget=True):
    """ZeRO-2's hook with one classic mistake: the sum (divide=0), a doubled division
    (divide=2), another rank's row (row=1), full gradients kept, a reduce-scatter per
    parameter, or a count of ready gradients never cleared."""
    from d2lpar.zero import pad_to_shards

    def zero2_hook(bucket, shards, n, rank, reduce_scatter):
        ready = set()

        def reduce(params):
            sizes = [shards[q].numel() for q in params]
            rows = torch.empty(n, sum(sizes))
            for q, columns in zip(params, rows.split(sizes, dim=1)):
                columns.copy_(pad_to_shards(q.grad, n))
                if free:
                    q.grad = None
            reduce_scatter(list(rows))
            for q, grad in zip(params, (rows[(rank + row) % n] / n ** divide).split(sizes)):
                shards[q].grad = grad

        def hook(p):
            if per_parameter:
                return reduce([p])
            ready.add(p)
            if len(ready) == len(bucket):
                if forget:
                    ready.clear()
                reduce(bucket)
        return hook
    return zero2_hook


@pytest.mark.parametrize('seed', range(3))
@pytest.mark.parametrize('wrong, hint', [
    (zero2_variant(divide=0), 'N = 2 times too large'),
    (zero2_variant(divide=2), 'divided twice'),
    (zero2_variant(row=1), "another rank's shard"),
    (zero2_variant(free=False), 'the peak is not lowered'),
    (zero2_variant(per_parameter=True), 'one per bucket'),
    (zero2_variant(forget=False), 'failed in the second'),
], ids=['no-division', 'doubled-division', 'wrong-row', 'not-freed', 'per-parameter',
        'count-not-cleared'])
def test_zero2_hook_wrong_answers_get_their_hint(wrong, hint, seed):
    verdict = exercises.check_zero2_hook(wrong, seed=seed)
    assert not verdict.passed and verdict.attempted and hint in verdict.message, verdict


def test_zero2_hook_variant_without_mistakes_passes():
    # the wrong answers above differ from a right one by their mistake only
    assert exercises.check_zero2_hook(zero2_variant(), seed=0).passed


def test_zero2_hook_ranks_that_never_meet_fail_without_hanging(monkeypatch):
    from d2lpar.exercises import sharding
    monkeypatch.setattr(sharding, '_TIMEOUT', 0.5)
    solution_hook = solution('10_zero', 'zero2_hook')

    def rank0_skips(bucket, shards, n, rank, reduce_scatter):
        return solution_hook(bucket, shards, n, rank, reduce_scatter if rank else lambda rows: rows)
    verdict = exercises.check_zero2_hook(rank0_skips, seed=0)
    assert not verdict.passed and 'did not meet' in verdict.message, verdict


@pytest.mark.parametrize('wrong, hint', [
    (lambda rows, n, rank: rows // n, 'even split'),
    (lambda rows, n, rank: rows // n + (rank < rows % n), 'tensor_split'),
    (lambda rows, n, rank: -(-rows // n), 'maybe none'),
    (lambda rows, n, rank: -(-rows // n) if rank < n - 1 else rows % n, 'expected'),
])
def test_shard_rows_wrong_answers_get_their_hint(wrong, hint):
    verdict = exercises.check_shard_rows(wrong, seed=0)
    assert not verdict.passed and hint in verdict.message, verdict


def test_shard_rows_reference_agrees_with_torch_chunk():
    fn = solution('11_fsdp2', 'shard_rows')
    for rows in range(1, 20):
        for n in range(1, 6):
            pieces = [len(c) for c in torch.arange(rows).chunk(n)]
            assert [fn(rows, n, r) for r in range(n)] == pieces + [0] * (n - len(pieces))


def test_bubble_reference_agrees_with_d2lpar_and_the_hand_formula():
    from d2lpar.exercises.model_parallel import _gpipe_idle
    for p in range(1, 6):
        for m in range(1, 9):
            for t_backward in (1, 2, 3):
                events = d2lpar.pipeline_schedule(p, m, t_forward=1, t_backward=t_backward)
                assert math.isclose(_gpipe_idle([1.0] * p, m, t_backward),
                                    d2lpar.idle_fraction(events, p), abs_tol=1e-12)
    rng = random.Random(0)
    for _ in range(200):
        times = [rng.uniform(0.5, 3) for _ in range(rng.randint(1, 6))]
        m, backward = rng.randint(1, 30), rng.uniform(0.5, 3)
        span = sum(times) + (m - 1) * max(times)
        assert math.isclose(_gpipe_idle(times, m, backward),
                            1 - m * sum(times) / (len(times) * span), abs_tol=1e-12)


# ------------------------------------------------------ the course notebooks

def chapters():
    return sorted(p for p in NOTEBOOKS.glob('[0-9][0-9]_*.ipynb'))


def exercise_cells(path):
    """Return the code cells of a notebook's Exercises section (stubs and checker calls)."""
    nb = json.loads(path.read_text())
    start = max((i for i, c in enumerate(nb['cells']) if c['cell_type'] == 'markdown'
                 and re.search(r'^#+\s*Exercises', ''.join(c['source']), re.M)), default=None)
    if start is None:
        return []
    return [''.join(c['source']) for c in nb['cells'][start:] if c['cell_type'] == 'code']


def run_cell(source, namespace, name):
    """Run a cell's code as Jupyter does; return the value of a final expression (else None)."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, name, 'exec'), namespace)
    if last is not None:
        return eval(compile(ast.Expression(last.value), name, 'eval'), namespace)


def checker_calls(source):
    return re.findall(r'exercises\.(check_\w+)\(', source)


def test_every_notebook_has_a_checked_exercise_with_a_solution():
    solved = {c.__name__: chapter for c, (chapter, _) in CHECKS.items()}
    for path in chapters():
        used = [name for source in exercise_cells(path) for name in checker_calls(source)]
        assert used, (f'{path.name} has no checked exercise: its Exercises section calls no '
                      'd2lpar.exercises checker')
        for name in used:
            assert name in solved, f'{path.name} calls exercises.{name}, which does not exist'
            assert solved[name] == path.stem, \
                f'{path.name}: the reference solution for {name} is in {solved[name]}_solutions'


@pytest.mark.parametrize('path', chapters(), ids=lambda p: p.stem)
def test_notebook_stubs_are_not_attempted_and_never_raise(path):
    cells = exercise_cells(path)
    if not any(checker_calls(source) for source in cells):
        pytest.skip(f'{path.name} has no checked exercise yet')
    namespace = {'d2lpar': d2lpar}
    for source in cells:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            shown = run_cell(source, namespace, path.name)
        if checker_calls(source):  # it prints the verdict, or shows it as its last expression
            seen = printed.getvalue() + ('' if shown is None else str(shown))
            assert 'not attempted yet' in seen, seen


# ------------------------------------------------- notebook 12: the row-parallel linear

def _row_blocks(X, weight, n, weight_dim=1):
    return X.chunk(n, dim=1), weight.chunk(n, dim=weight_dim)


def rp_no_all_reduce(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    return [(x @ w.T + bias, G @ w, G.T @ x, G.sum(0)) for x, w in zip(Xs, Ws)]


def rp_reduces_twice(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    sums = all_reduce(all_reduce([x @ w.T for x, w in zip(Xs, Ws)]))
    return [(s + bias, G @ w, G.T @ x, G.sum(0)) for s, x, w in zip(sums, Xs, Ws)]


def rp_reduces_in_backward(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    sums, Gs = all_reduce([x @ w.T for x, w in zip(Xs, Ws)]), all_reduce([G] * n)
    return [(s + bias, g @ w, g.T @ x, g.sum(0)) for s, g, x, w in zip(sums, Gs, Xs, Ws)]


def rp_wrong_dimension(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n, weight_dim=0)  # the column-parallel split
    sums = all_reduce([x @ w.T for x, w in zip(Xs, Ws)])
    return [(s + bias, G @ w, G.T @ x, G.sum(0)) for s, x, w in zip(sums, Xs, Ws)]


def rp_bias_on_every_rank(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    sums = all_reduce([x @ w.T + bias for x, w in zip(Xs, Ws)])
    return [(s, G @ w, G.T @ x, G.sum(0)) for s, x, w in zip(sums, Xs, Ws)]


def rp_sums_without_communicating(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    total = sum(x @ w.T for x, w in zip(Xs, Ws)) + bias
    return [(total, G @ w, G.T @ x, G.sum(0)) for x, w in zip(Xs, Ws)]


def rp_full_input_gradient(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    sums = all_reduce([x @ w.T for x, w in zip(Xs, Ws)])
    return [(s + bias, G @ weight, G.T @ x, G.sum(0)) for s, x, w in zip(sums, Xs, Ws)]


@pytest.mark.parametrize('wrong, hint', [
    (rp_no_all_reduce, 'missing all-reduce'),
    (rp_reduces_twice, 'reducing twice'),
    (rp_reduces_in_backward, 'reducing twice'),
    (rp_wrong_dimension, 'weight.chunk(n, dim=1)'),
    (rp_bias_on_every_rank, 'bias was added'),
    (rp_sums_without_communicating, 'exactly one all_reduce'),
    (rp_full_input_gradient, 'its block of X has shape'),
], ids=lambda x: getattr(x, '__name__', None))
def test_row_parallel_wrong_answers_get_their_hint(wrong, hint):
    for seed in SEEDS:
        verdict = exercises.check_row_parallel_linear(wrong, seed=seed)
        assert verdict.attempted and not verdict.passed and hint in verdict.message, verdict


def test_row_parallel_reference_agrees_with_autograd_on_the_unsplit_layer():
    fn = solution('12_tensor_parallel', 'row_parallel_linear')
    layer, n = torch.nn.Linear(6, 4), 3
    X = torch.randn(5, 6, requires_grad=True)
    G = torch.randn(5, 4)
    out = layer(X)
    out.backward(G)
    ranks = fn(X.detach(), layer.weight.detach(), layer.bias.detach(), G, n,
               lambda ts: [sum(ts)] * len(ts))
    for r, (o, gx, gw, gb) in enumerate(ranks):
        torch.testing.assert_close(o, out.detach())
        torch.testing.assert_close(gx, X.grad.chunk(n, 1)[r])
        torch.testing.assert_close(gw, layer.weight.grad.chunk(n, 1)[r])
        torch.testing.assert_close(gb, layer.bias.grad)
# ------------------------------------------------- notebook 7: accumulation over uneven micro-batches

def accumulation_variant(scale, sync='last', step_every=False, zero=True):
    """An accumulation loop with one typical mistake (or none, with the defaults)."""
    def accumulate_uneven(net, optimizer, micro_batches, loss_fn):
        total, k = sum(len(y) for _, y in micro_batches), len(micro_batches)
        if zero:
            optimizer.zero_grad()
        for i, (X, y) in enumerate(micro_batches):
            synced = {'last': i == k - 1, 'every': True, 'never': False, 'first': i == 0}[sync]
            with contextlib.nullcontext() if synced else net.no_sync():
                (loss_fn(net(X), y) * scale(len(y), total, k)).backward()
            if step_every:
                optimizer.step()
                optimizer.zero_grad()
        if not step_every:
            optimizer.step()
    return accumulate_uneven


SHARE = lambda n, total, k: n / total  # noqa: E731 (the right weight)


@pytest.mark.parametrize('wrong, hint', [
    (accumulation_variant(lambda n, total, k: 1 / k), 'len(y_i) / total'),
    (accumulation_variant(lambda n, total, k: 1.0), 'not divided at all'),
    (accumulation_variant(SHARE, sync='every'), 'but the last inside'),
    (accumulation_variant(SHARE, sync='never'), 'would never allreduce'),
    (accumulation_variant(SHARE, sync='first'), 'not the last one'),
    (accumulation_variant(SHARE, step_every=True), 'step once, after the last micro-batch'),
    (accumulation_variant(SHARE, zero=False), 'optimizer.zero_grad()'),
], ids=['divides-by-k', 'no-division', 'syncs-every', 'never-syncs', 'syncs-first',
        'steps-every', 'no-zero-grad'])
def test_accumulation_wrong_answers_get_their_hint(wrong, hint):
    for seed in SEEDS:
        verdict = exercises.check_accumulation(wrong, seed=seed)
        assert verdict.attempted and not verdict.passed, verdict
        assert hint in verdict.message, verdict
    assert exercises.check_accumulation(accumulation_variant(SHARE), seed=0).passed


def test_accumulation_reference_equals_one_step_on_the_concatenated_batch():
    from d2lpar.exercises.ddp_practice import _StandInDDP
    fn = solution('07_ddp_practice', 'accumulate_uneven')
    torch.manual_seed(0)
    X, y = torch.randn(9, 3), torch.randint(0, 2, (9,))
    sizes = [2, 3, 4]
    nets = [torch.nn.Linear(3, 2) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [torch.optim.SGD(n.parameters(), lr=0.5) for n in nets]
    fn(_StandInDDP(nets[0]), opts[0], list(zip(X.split(sizes), y.split(sizes))),
       torch.nn.functional.cross_entropy)
    torch.nn.functional.cross_entropy(nets[1](X), y).backward()
    opts[1].step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        torch.testing.assert_close(a, b)


# ------------------------------------------------- notebook 13: interleaved stage placement

def stages_contiguous(rank, p, v, style):
    return [rank * v + i for i in range(v)]


def stages_reversed(rank, p, v, style):
    return list(reversed([rank + k * p for k in range(v)])) if style == 'loop' else [2 * p - 1 - rank, rank]


def stages_loop_for_v(rank, p, v, style):
    return [rank + k * p for k in range(v)]


def stages_off_by_one(rank, p, v, style):
    return [rank + k * p for k in range(v)] if style == 'loop' else [rank, 2 * p - rank]


@pytest.mark.parametrize('wrong, hint', [
    (stages_contiguous, 'neighbouring stages'),
    (stages_reversed, 'in another order'),
    (stages_loop_for_v, 'is the loop placement'),
    (stages_off_by_one, "'v' (v = 2): rank r holds stage r"),
], ids=lambda x: getattr(x, '__name__', None))
def test_interleaved_stages_wrong_answers_get_their_hint(wrong, hint):
    for seed in SEEDS:
        verdict = exercises.check_interleaved_stages(wrong, seed=seed)
        assert verdict.attempted and not verdict.passed and hint in verdict.message, verdict


def test_interleaved_stages_reference_matches_what_the_schedules_accept():
    """The reference's placements are the ones torch's schedules ran in notebook 13's script."""
    fn = solution('13_pipeline_parallel', 'interleaved_stages')
    assert [fn(r, 2, 2, 'loop') for r in range(2)] == [[0, 2], [1, 3]]  # the script's r, r + p
    assert [fn(r, 2, 2, 'v') for r in range(2)] == [[0, 3], [1, 2]]  # the script's r, 2p - 1 - r
# ------------------------------------------------- notebook 14: merging running softmax states

def merge_no_rescale(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), l1 + l2, acc1 + acc2


def merge_adds_outputs(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), torch.ones_like(l1), acc1 / l1 + acc2 / l2


def merge_averages_outputs(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), torch.ones_like(l1), (acc1 / l1 + acc2 / l2) / 2


def merge_without_running_max(m1, l1, acc1, m2, l2, acc2):
    e1, e2 = torch.exp(m1), torch.exp(m2)
    return torch.zeros_like(m1), e1 * l1 + e2 * l2, e1 * acc1 + e2 * acc2


def merge_relative_to_first(m1, l1, acc1, m2, l2, acc2):
    a2 = torch.exp(m2 - m1)  # fine until block 1 is masked out (m1 = -inf)
    return m1, l1 + a2 * l2, acc1 + a2 * acc2


def merge_inverse_factor(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m - m1), torch.exp(m - m2)
    return m, a1 * l1 + a2 * l2, a1 * acc1 + a2 * acc2


@pytest.mark.parametrize('wrong, hint', [
    (merge_no_rescale, 'relative to its own maximum'),
    (merge_adds_outputs, 'normalised outputs'),
    (merge_averages_outputs, 'equal weights'),
    (merge_without_running_max, 'overflows'),
    (merge_relative_to_first, 'm_i = -inf'),
    (merge_inverse_factor, 'not exp(m - m_i)'),
], ids=lambda x: getattr(x, '__name__', None))
def test_merge_wrong_answers_get_their_hint(wrong, hint):
    for seed in SEEDS:
        verdict = exercises.check_online_softmax_merge(wrong, seed=seed)
        assert verdict.attempted and not verdict.passed and hint in verdict.message, verdict


def test_merge_reference_agrees_with_torch_on_the_ring_attention_merge():
    """The (m, l, acc) state and d2lpar's (O, lse) merge describe the same result."""
    from d2lpar.context_parallel import attend_block, merge_attention
    from d2lpar.exercises.context_expert import partial
    fn = solution('14_context_expert', 'merge_partial')
    torch.manual_seed(0)
    Q, K, V = torch.randn(4, 3, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64), \
        torch.randn(7, 3, dtype=torch.float64)
    s = Q @ K.T / 3 ** 0.5
    m, l, acc = fn(*partial(s[:, :3], V[:3]), *partial(s[:, 3:], V[3:]))
    O, lse = merge_attention(*attend_block(Q, K[:3], V[:3]), *attend_block(Q, K[3:], V[3:]))
    torch.testing.assert_close(acc / l, O)
    torch.testing.assert_close(m + torch.log(l), lse)

# ------------------------------------------------- notebook 17: choosing a layout

def _search(key):
    from d2lpar.exercises.capstone import _layouts, predict_layout

    def choose(cfg, gpus, num_seqs, seq_len, memory_limit):
        return min(_layouts(cfg, gpus, num_seqs),
                   key=lambda l: predict_layout(cfg, gpus, num_seqs, seq_len, l)[key])
    return choose


def choose_ignoring_memory(*args):
    return _search('step_s')(*args)  # the fastest, fits or not


def choose_least_memory(*args):
    return _search('peak')(*args)  # fits, but not the fastest


def choose_all_fsdp(cfg, gpus, *args):
    return dict(fsdp=gpus)


def choose_wrong_product(cfg, gpus, *args):
    return dict(fsdp=gpus, tp=2)


def choose_list(cfg, gpus, *args):
    return [1, gpus, 1]


@pytest.mark.parametrize('wrong, hints', [
    (choose_ignoring_memory, ('more than the limit',)),
    (choose_least_memory, ('fits but its step takes',)),
    (choose_all_fsdp, ('more than the limit', 'fits but its step takes')),
    (choose_wrong_product, ('is no layout',)),
    (choose_list, ('return a dict',)),
], ids=lambda x: getattr(x, '__name__', None))
def test_choose_layout_wrong_answers_get_their_hint(wrong, hints):
    failed = 0
    for seed in SEEDS:
        verdict = exercises.check_choose_layout(wrong, seed=seed)
        if not verdict.passed:
            assert verdict.attempted and any(h in verdict.message for h in hints), verdict
            failed += 1
    assert failed == len(SEEDS)  # six cases per seed: a wrong rule is caught on every seed


@pytest.mark.parametrize('wrong', [lambda C, M: math.sqrt(C * M), lambda C, M: 2 * C * M,
                                   lambda C, M: math.sqrt(2 * M / C), lambda C, M: M / 2,
                                   lambda C, M: 1.3 * math.sqrt(2 * C * M)])
def test_wrong_checkpoint_intervals_fail(wrong):
    for seed in SEEDS:
        verdict = exercises.check_checkpoint_interval(wrong, seed=seed)
        assert verdict.attempted and not verdict.passed, verdict
        assert 'Hint' in verdict.message
