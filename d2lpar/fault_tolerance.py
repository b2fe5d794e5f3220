"""Fault tolerance (notebook 16): finding a stuck rank, checkpoint intervals, replicas that recover.

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb16_fault_tolerance.py (edit the notebook's `#@save` cell, then `make lib`).
"""

from .lessons.nb16_fault_tolerance import *  # noqa: F403
