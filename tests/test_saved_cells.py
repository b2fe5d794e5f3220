"""Every `#@save` cell of a notebook is the package's code (d2l's convention, checked)."""
import ast
import json

import pytest

import saved_cells
from saved_cells import NOTEBOOKS, compare, definitions, problems, saved_names

CHAPTERS = sorted(NOTEBOOKS.glob('[0-9][0-9]_*.ipynb'))

# What each notebook must write in its own cells (the algorithms it teaches).
REQUIRED = {
    '03_data_parallel': ['scatter_inputs', 'Replica', 'replicate', 'parallel_apply', 'gather',
                         'data_parallel', 'HandDataParallel', 'save_checkpoint',
                         'load_state_dict_flexible'],
    '09_collectives': ['combine', 'broadcast', 'reduce', 'naive_allreduce', 'ring_reduce_scatter',
                       'ring_all_gather', 'all_gather', 'reduce_scatter', 'ring_allreduce',
                       'allreduce_cost', 'bandwidths', 'HookDDP', 'make_buckets', 'BucketDDP',
                       'MiniDDP'],
    '08_lenet_data_parallel': ['init_lenet_params', 'lenet', 'get_params', 'allreduce', 'scatter',
                               'split_batch', 'train_batch', 'train'],
    '10_zero': ['model_state_bytes', 'pad_to_shards', 'Zero1', 'Zero2', 'Zero3', 'RingDDP',
                'zero_bytes_sent'],
    '11_fsdp2': ['shard_blocks'],
    '07_ddp_practice': ['accumulate_step', 'amp_step', 'counting_backend', 'train_uneven',
                        'evaluate_distributed', 'loader_workers'],
    '04_model_parallel': ['ModelParallel', 'pipeline_schedule', 'bubble_fraction', 'idle_fraction',
                          'gpipe_stage', 'StageLinks', 'gpipe_step'],
    '12_tensor_parallel': ['CopyToParallel', 'ReduceFromParallel', 'copy_to_parallel',
                           'reduce_from_parallel', 'ColumnParallelLinear', 'RowParallelLinear',
                           'ParallelMLP', 'attend', 'SelfAttention', 'ParallelSelfAttention',
                           'Block', 'megatron_block', 'CopyAndLinear', 'all_gather_tokens',
                           'reduce_scatter_tokens', 'GatherTokens', 'ScatterTokens',
                           'sequence_parallel_block', 'sum_replicated_grads', 'saved_bytes',
                           'count_wire_bytes', 'block_bytes'],
    '13_pipeline_parallel': ['Busy', 'StandInDevice', 'split_backward', 'interleaved_bubble',
                             'replay_quorums'],
    '05_ddp': ['init_process', 'make_loader', 'train_epoch', 'train_ddp'],
    '06_ddp_launching': ['load_snapshot'],
    '14_context_expert': ['pairwise_all_to_all', 'all_to_all_cost', 'route', 'expert_capacity',
                          'load_balancing_loss', 'MoE', 'AllToAll', 'ExpertParallelMoE',
                          'attend_block', 'merge_attention', 'sequence_chunks', 'shard_sequence',
                          'chunk_mask', 'RingAttention', 'ring_attention', 'ring_attention_bytes'],
    '15_fault_tolerance': ['set_timeout', 'behind', 'young_interval', 'expected_waste', 'simulate_run', 'make_net', 'global_batch', 'shard', 'full_loss', 'local_grads', 'replay_quorums'],
    '17_capstone': ['CausalAttention', 'GPTBlock', 'TinyGPT', 'lm_loss', 'counting_task', 'layout_mesh',
                    'coordinates', 'pipeline_stage', 'tensor_plan', 'parallelize', 'average_gradients',
                    'train_step', 'full_parameters', 'StepCost', 'layout_cost'],
}


def notebook(tmp_path, *sources):
    """Write a notebook whose code cells are `sources`; return its path."""
    cells = [{'cell_type': 'code', 'metadata': {}, 'execution_count': None, 'outputs': [],
              'source': source} for source in sources]
    path = tmp_path / '99_probe.ipynb'
    path.write_text(json.dumps({'cells': cells, 'metadata': {}, 'nbformat': 4,
                                'nbformat_minor': 5}))
    return path


@pytest.mark.parametrize('path', CHAPTERS, ids=lambda p: p.stem)
def test_saved_cells_match_the_package(path):
    found = problems(path)
    assert not found, '\n\n'.join(found)


@pytest.mark.parametrize('stem', sorted(REQUIRED))
def test_each_notebook_writes_what_it_teaches(stem):
    saved = set(saved_names(NOTEBOOKS / f'{stem}.ipynb'))
    missing = [name for name in REQUIRED[stem] if name not in saved]
    assert not missing, f'{stem} must define these in #@save cells: {missing}'


def test_no_name_is_saved_by_two_notebooks():
    owner = {}
    for path in CHAPTERS:
        for name in saved_names(path):
            assert name not in owner, f'{name} is saved by both {owner[name]} and {path.name}'
            owner[name] = path.name


PACKAGE = '''
@checked(_check_split)
def split(X, devices):
    """Split X into one part per device."""
    return [part.to(d) for part, d in zip(X.chunk(len(devices)), devices)]
'''
CELL = '''#@save
import torch

def split(X, devices):
    """Split X into one part per device."""
    return [part.to(d) for part, d in zip(X.chunk(len(devices)), devices)]
'''


def fake_package(source):
    return lambda name: definitions(source).get(name)


def test_the_comparison_ignores_checks_and_package_prefixes(tmp_path):
    qualified = CELL.replace('X.chunk(len(devices))', 'd2lpar.chunks(X, devices)')
    package = PACKAGE.replace('X.chunk(len(devices))', 'chunks(X, devices)')
    assert problems(notebook(tmp_path, CELL), fake_package(PACKAGE)) == []
    assert problems(notebook(tmp_path, qualified), fake_package(package)) == []


def test_an_edit_on_either_side_is_caught(tmp_path):
    edited_cell = CELL.replace('zip(X.chunk', 'zip(X.flip(0).chunk')
    edited_package = PACKAGE.replace('part.to(d)', 'part.to(d, copy=True)')
    found = problems(notebook(tmp_path, edited_cell), fake_package(PACKAGE))
    assert len(found) == 1 and '-    return [part.to(d) for part, d in zip(X.flip(0)' in found[0]
    found = problems(notebook(tmp_path, CELL), fake_package(edited_package))
    assert len(found) == 1 and '+    return [part.to(d, copy=True)' in found[0]
    # A docstring is part of the code, and a name the package lacks is reported.
    found = problems(notebook(tmp_path, CELL.replace('one part', 'a part')),
                     fake_package(PACKAGE))
    assert len(found) == 1 and 'differ' in found[0]
    found = problems(notebook(tmp_path, CELL), fake_package(''))
    assert found == ['99_probe.ipynb cell 0: split: saved in the notebook but not found in d2lpar']


def test_only_marked_cells_count(tmp_path):
    unmarked = CELL.replace('#@save\n', '')
    assert saved_names(notebook(tmp_path, unmarked, CELL)) == ['split']
    assert problems(notebook(tmp_path, unmarked), fake_package('')) == []


def test_an_edit_to_a_real_saved_cell_is_caught(tmp_path):
    """Mutate each notebook's first saved definition: the real package must disagree."""
    tried = 0
    for path in CHAPTERS:
        cells = saved_cells.saved_cells(path)
        if not cells:
            continue
        index, source = cells[0]
        name, node = next(iter(definitions(source).items()))
        node.body.append(ast.parse('pass').body[0])  # one extra statement
        assert compare(node, saved_cells.package_definition(name), name), path.name
        tried += 1
    if not tried:
        pytest.skip('no notebook has #@save cells yet')
