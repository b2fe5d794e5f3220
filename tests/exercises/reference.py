"""Shared by the exercise checkers' tests: the reference solutions and the wrong-answer assertion.

The reference solutions are read from notebooks/solutions/ (the cells tagged
`solution`), so the tests check the very code instructors hand out.
"""

import json
from pathlib import Path

from d2lpar import exercises

ROOT = Path(__file__).resolve().parents[2]
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
    exercises.check_mfu: ('13_tensor_parallel_dtensor', 'mfu'),
    exercises.check_interleaved_stages: ('14_pipeline_parallel', 'interleaved_stages'),
    exercises.check_online_softmax_merge: ('15_context_expert', 'merge_partial'),
    exercises.check_largest_batch: ('17_reasoning_at_scale', 'largest_batch'),
    exercises.check_choose_layout: ('18_capstone', 'choose_layout'),
    exercises.check_checkpoint_interval: ('16_fault_tolerance', 'checkpoint_interval'),
}


def cells(path, tag=None):
    """Return the code cells of a notebook (only those tagged `tag`, if given) as sources."""
    nb = json.loads(path.read_text())
    return [
        ''.join(c['source'])
        for c in nb['cells']
        if c['cell_type'] == 'code' and (tag is None or tag in c.get('metadata', {}).get('tags', []))
    ]


def solution(chapter, name):
    namespace = {}
    sources = cells(NOTEBOOKS / 'solutions' / f'{chapter}_solutions.ipynb', 'solution')
    assert sources, f'{chapter}_solutions.ipynb has no cell tagged "solution"'
    for source in sources:
        exec(compile(source, f'{chapter}_solutions', 'exec'), namespace)
    return namespace[name]


def wrong_ids(wrong):
    """Return the test ids of (checker, answer, hint) rows: checker-answer-hint."""
    return [f'{c.__name__}-{getattr(a, "__name__", "")}-{h}' for c, a, h in wrong]


def assert_rejected(check, answer, hint):
    """Assert that `check` rejects `answer` on every seed, with `hint` in its message."""
    for seed in SEEDS:
        verdict = check(answer, seed=seed)
        assert verdict.attempted and not verdict.passed, verdict
        assert hint in verdict.message, verdict
