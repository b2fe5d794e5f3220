"""Checkers for the notebooks' "implement this" exercises, one module per notebook.

Each `check_xxx(fn)` runs the learner's function on several randomized cases
(edge cases included), compares it with a reference (PyTorch itself, a
tested d2lpar primitive, or a hand calculation) and returns a `Verdict`. A
checker never raises because of the answer: a wrong result, a function that
raises, and a stub that still raises NotImplementedError (reported as "not
attempted yet") all become verdicts with a message and a hint.
"""

from ._verdict import Verdict
from .capstone import check_choose_layout
from .collectives import check_broadcast_schedule
from .context_expert import check_online_softmax_merge
from .data_parallel import check_load_checkpoint
from .ddp import check_sampler
from .ddp_launching import check_slurm_ranks
from .ddp_practice import check_accumulation
from .fault_tolerance import check_checkpoint_interval
from .fsdp import check_shard_rows
from .lenet_data_parallel import check_ring_allreduce, check_split_batch
from .model_parallel import check_unbalanced_bubble
from .pipeline_parallel import check_interleaved_stages
from .reasoning_at_scale import check_largest_batch
from .zero import check_zero2_hook
from .single_device import check_pick_device
from .tensor_parallel import check_row_parallel_linear
from .tensor_parallel_dtensor import check_mfu
from .visible_devices import check_visible_count

__all__ = [
    'Verdict',
    'check_pick_device',
    'check_visible_count',
    'check_load_checkpoint',
    'check_unbalanced_bubble',
    'check_sampler',
    'check_ring_allreduce',
    'check_split_batch',
    'check_broadcast_schedule',
    'check_zero2_hook',
    'check_shard_rows',
    'check_slurm_ranks',
    'check_accumulation',
    'check_row_parallel_linear',
    'check_mfu',
    'check_interleaved_stages',
    'check_online_softmax_merge',
    'check_choose_layout',
    'check_checkpoint_interval',
    'check_largest_batch',
]
