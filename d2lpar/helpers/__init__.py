"""Helpers the notebooks use but do not teach, one idea per module.

A notebook reaches them as d2lpar.X or through its chapter's name (d2lpar.model_parallel,
d2lpar.ddp_practice, ...), which re-exports its lesson and these helpers.

d2l.py        d2l's own helpers, as the book defines them: accuracy, evaluate_accuracy_gpu, sgd, Residual
train_result  TrainResult, what notebook 8's `train` returns
schedules.py  checking and drawing a pipeline schedule: schedule_problems, plot_schedule (notebooks 4, 14)
footprint.py  memory_footprint: the bytes a training step needs, by kind (notebook 4)
timings.py    allreduce_timings: the hand-written and the built-in allreduce timed (notebook 9)
probes.py     what this machine can do: a C++ compiler for inductor, pinned memory, bfloat16 (notebook 7)
profiling.py  a DDP step's profile read and drawn: gradients against allreduces (notebook 7)
memory.py     StepMemory: the bytes of every storage over a training step (notebooks 10, 11; d2lpar.memory)
comm_counts.py collective_counter: CommDebugMode counting collectives only (notebook 18)
"""
