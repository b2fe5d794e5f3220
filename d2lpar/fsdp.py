"""FSDP2 in practice (notebook 11): fully_shard applied per block and on the root.

Each definition is a `#@save` cell of notebook 11 (tests/test_saved_cells.py
compares them).
"""
from torch.distributed.fsdp import fully_shard

__all__ = ['shard_blocks']


def shard_blocks(net, mesh, blocks, **kwargs):
    """Apply fully_shard to each of `blocks`, then to `net` (the root); return `net`."""
    for block in blocks:
        fully_shard(block, mesh=mesh, **kwargs)
    kwargs.pop('reshard_after_forward', None)  # the root keeps its own default
    return fully_shard(net, mesh=mesh, **kwargs)
