"""d2lpar/lessons is generated from the notebooks' `#@save` cells (`make lib`), and up to date.

What a notebook teaches, it writes once, in its own cells; `make lib` (d2lpar/tools/lib.py)
copies them into d2lpar/lessons/nbNN_<name>.py and applies the checks that
d2lpar/checks/nbNN_<name>.py lists. These tests fail when a notebook changed and the package
was not regenerated, or when the generator would lose or misplace a cell.
"""

import ast
import json
import subprocess
import sys

import pytest

from d2lpar.tools import lib

CHAPTERS = sorted(lib.NOTEBOOKS.glob(lib.PATTERN))


def saved_names(path):
    """Return the names a notebook's `#@save` cells define, in order."""
    return [
        node.name
        for _, source in lib.saved_cells(path)[1]
        for node in ast.parse(source).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]


# What each notebook must write in its own cells (the algorithms it teaches).
REQUIRED = {
    '03_data_parallel': [
        'scatter_inputs',
        'Replica',
        'replicate',
        'parallel_apply',
        'gather',
        'data_parallel',
        'HandDataParallel',
        'save_checkpoint',
        'load_state_dict_flexible',
    ],
    '09_collectives': [
        'combine',
        'broadcast',
        'reduce',
        'naive_allreduce',
        'ring_reduce_scatter',
        'ring_all_gather',
        'all_gather',
        'reduce_scatter',
        'ring_allreduce',
        'allreduce_cost',
        'bandwidths',
        'HookDDP',
        'make_buckets',
        'BucketDDP',
        'MiniDDP',
    ],
    '08_lenet_data_parallel': [
        'init_lenet_params',
        'lenet',
        'get_params',
        'allreduce',
        'scatter',
        'split_batch',
        'train_batch',
        'train',
    ],
    '10_zero': ['model_state_bytes', 'pad_to_shards', 'Zero1', 'Zero2', 'Zero3', 'RingDDP', 'zero_bytes_sent'],
    '11_fsdp2': ['shard_blocks'],
    '07_ddp_practice': [
        'accumulate_step',
        'amp_step',
        'counting_backend',
        'train_uneven',
        'evaluate_distributed',
        'loader_workers',
    ],
    '04_model_parallel': [
        'ModelParallel',
        'pipeline_schedule',
        'bubble_fraction',
        'idle_fraction',
        'gpipe_stage',
        'StageLinks',
        'gpipe_step',
    ],
    '12_tensor_parallel': [
        'CopyToParallel',
        'ReduceFromParallel',
        'copy_to_parallel',
        'reduce_from_parallel',
        'ColumnParallelLinear',
        'RowParallelLinear',
        'ParallelMLP',
        'attend',
        'SelfAttention',
        'ParallelSelfAttention',
        'Block',
        'megatron_block',
        'CopyAndLinear',
        'all_gather_tokens',
        'reduce_scatter_tokens',
        'GatherTokens',
        'ScatterTokens',
        'sequence_parallel_block',
        'sum_replicated_grads',
        'saved_bytes',
        'count_wire_bytes',
    ],
    '13_tensor_parallel_dtensor': ['block_bytes'],
    '14_pipeline_parallel': [
        'Busy',
        'StandInDevice',
        'split_backward',
        'InFlight',
        'interleaved_bubble',
        'replay',
        'Stage',
    ],
    '05_ddp': ['init_process', 'make_loader', 'train_epoch', 'train_ddp'],
    '06_ddp_launching': ['load_snapshot'],
    '15_context_expert': [
        'pairwise_all_to_all',
        'all_to_all_cost',
        'route',
        'expert_capacity',
        'load_balancing_loss',
        'MoE',
        'AllToAll',
        'ExpertParallelMoE',
        'attend_block',
        'merge_attention',
        'sequence_chunks',
        'shard_sequence',
        'chunk_mask',
        'pass_on',
        'visible_pairs',
        'ring_forward',
        'ring_backward',
        'RingAttention',
        'ring_attention',
        'ring_attention_bytes',
    ],
    '16_fault_tolerance': [
        'set_timeout',
        'behind',
        'young_interval',
        'expected_waste',
        'simulate_run',
        'make_net',
        'global_batch',
        'shard',
        'full_loss',
        'local_grads',
        'replay_quorums',
        'slow_all_reduce',
        'outer_step',
    ],
    '18_capstone': [
        'CausalAttention',
        'GPTBlock',
        'TinyGPT',
        'lm_loss',
        'counting_task',
        'layout_mesh',
        'coordinates',
        'pipeline_stage',
        'tensor_plan',
        'parallelize',
        'average_gradients',
        'train_step',
        'full_parameters',
        'StepCost',
        'layout_cost',
    ],
}


def notebook(tmp_path, *sources, name='99_probe.ipynb'):
    """Write a notebook whose code cells are `sources`; return its path."""
    cells = [
        {'cell_type': 'code', 'id': f'c{i}', 'metadata': {}, 'execution_count': None, 'outputs': [], 'source': source}
        for i, source in enumerate(sources)
    ]
    path = tmp_path / name
    path.write_text(json.dumps({'cells': cells, 'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}))
    return path


def test_the_lessons_are_generated_from_the_notebooks():
    stale = lib.stale()
    assert not stale, (
        f'{[str(p.relative_to(lib.ROOT)) for p in stale]} differ from the notebooks: '
        'run `make lib` (never edit d2lpar/lessons by hand)'
    )


def test_make_lib_check_runs_without_importing_the_package():
    """`make lib` must work even when a lesson module is broken, so it never imports d2lpar."""
    done = subprocess.run(
        [sys.executable, str(lib.ROOT / 'd2lpar/tools/lib.py'), '--check'], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize('stem', sorted(REQUIRED))
def test_each_notebook_writes_what_it_teaches(stem):
    saved = set(saved_names(lib.NOTEBOOKS / f'{stem}.ipynb'))
    missing = [name for name in REQUIRED[stem] if name not in saved]
    assert not missing, f'{stem} must define these in #@save cells: {missing}'


def test_no_name_is_saved_by_two_notebooks():
    owner = {}
    for path in CHAPTERS:
        for name in saved_names(path):
            assert name not in owner, f'{name} is saved by both {owner[name]} and {path.name}'
            owner[name] = path.name


def test_every_saved_name_is_reachable_from_the_package():
    import importlib

    import d2lpar

    for path in CHAPTERS:
        names = saved_names(path)
        if names:
            module = importlib.import_module(f'd2lpar.lessons.{lib.module_name(path)}')
            assert [n for n in names if not hasattr(module, n)] == [], path.name
    assert d2lpar.allreduce.__module__ == 'd2lpar.lessons.nb08_lenet_data_parallel'


CELL = '''#@save
import torch

def split(X, devices):
    """Split X into one part per device."""
    return [part.to(d) for part, d in zip(torch.chunk(X, len(devices)), devices)]
'''


def test_a_saved_cell_is_copied_whole_with_its_imports_and_where_it_is_taught(tmp_path):
    path = notebook(tmp_path, 'import math\nimport torch', 'x = 1', CELL + '\nSIZES = (1, 2)\n')
    text = lib.lesson_source(path)
    assert 'do not edit' in text and 'notebooks/99_probe.ipynb, cell 2' in text
    assert text.count('import torch') == 1 and 'import math' not in text  # only what it uses
    assert 'SIZES = (1, 2)' in text and '#@save\n' not in text  # constants too, d2l's marker dropped
    namespace = {}
    exec(compile(text, 'lesson', 'exec'), namespace)
    assert namespace['__all__'] == ['split', 'SIZES']
    assert [t.tolist() for t in namespace['split'](__import__('torch').arange(4), ['cpu'] * 2)] == [[0, 1], [2, 3]]


def test_an_edit_to_a_real_saved_cell_makes_its_module_stale(tmp_path):
    """Edit each notebook's first saved cell in a copy: the generated text must change with it."""
    tried = 0
    for path in CHAPTERS:
        cells = json.loads(path.read_text())
        for cell in cells['cells']:
            if cell['cell_type'] == 'code' and ''.join(cell['source']).lstrip().startswith(lib.MARK):
                cell['source'] = ''.join(cell['source']) + '\nEDITED = 1\n'
                break
        else:
            continue
        copy = tmp_path / path.name
        copy.write_text(json.dumps(cells))
        committed = (lib.LESSONS / f'{lib.module_name(path)}.py').read_text()
        assert lib.lesson_source(copy) != committed and 'EDITED = 1' in lib.lesson_source(copy)
        tried += 1
    assert tried


def test_a_check_for_a_definition_no_cell_has_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(lib, 'check_names', lambda notebook: ['split', 'gone'])
    with pytest.raises(SystemExit, match="CHECKS names \\['gone'\\]"):
        lib.lesson_source(notebook(tmp_path, CELL))


def test_checks_are_applied_above_the_definition_they_name(tmp_path, monkeypatch):
    cell = CELL + '\n\nclass Net:\n    @staticmethod\n    def run(x):\n        return x\n'
    monkeypatch.setattr(lib, 'check_names', lambda notebook: ['split', 'Net.run'])
    text = lib.lesson_source(notebook(tmp_path, cell))
    assert "@checked(CHECKS['split'])\ndef split(" in text
    assert "    @checked(CHECKS['Net.run'])\n    @staticmethod\n    def run(" in text


def test_a_saved_cell_that_does_more_than_define_is_refused(tmp_path):
    with pytest.raises(SystemExit, match='only defines'):
        lib.lesson_source(notebook(tmp_path, CELL + '\nprint(split)\n'))


def test_only_marked_cells_count(tmp_path):
    unmarked = CELL.replace('#@save\n', '')
    assert lib.lesson_source(notebook(tmp_path, unmarked)) is None
