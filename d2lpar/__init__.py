"""d2lpar: the support package of a notebook course on multi-GPU training.

d2lpar/lessons    what the notebooks teach, generated from their `#@save` cells (`make lib`)
d2lpar/checks     the argument checks applied to the lessons' functions
d2lpar/helpers    what a notebook uses but does not teach (d2l's accuracy and sgd, plot_schedule, ...)
d2lpar/exercises  the checkers of each notebook's exercises
d2lpar/machinery  the course's machinery, taught nowhere: launch, processes, a launched rank's
                  helpers, saving files whole, the machine report, the rendered site
d2lpar/tools      maintainer tools run by path (`make lib`, `make normalize`)
d2lpar/*.py       the d2l-style helpers (devices, timing, plotting, data) and, under each
                  chapter's name (collectives, zero, ...), its lesson and helpers re-exported;
                  distributed, saving and memory re-export machinery and helpers for scripts
"""

from .data import (
    TensorLoader,
    data_root,
    fashion_mnist_source,
    get_fashion_mnist_labels,
    load_data_fashion_mnist,
    offline,
)
from .dataparallel import (
    HandDataParallel,
    Replica,
    data_parallel,
    gather,
    load_state_dict_flexible,
    parallel_apply,
    replicate,
    save_checkpoint,
    scatter_inputs,
)
from .devices import (
    device_slots,
    env_flag,
    gpu_problem,
    hardware_tier,
    num_gpus,
    small_workload,
    synchronize,
    try_all_gpus,
    try_gpu,
)
from .miniddp import BucketDDP, HookDDP, MiniDDP
from .model_parallel import (
    ModelParallel,
    StageLinks,
    bubble_fraction,
    gpipe_stage,
    gpipe_step,
    idle_fraction,
    memory_footprint,
    pipeline_schedule,
    plot_schedule,
    schedule_problems,
)
from .models import Residual, accuracy, evaluate_accuracy_gpu, init_lenet_params, lenet
from .parallel import allreduce, get_params, scatter, split_batch
from .plotting import Animator
from .timing import Accumulator, Timer
from .training import TrainResult, sgd, train, train_batch
from .visibility import (
    choose_gpu,
    exclusive_gpus,
    misspelled_cuda_vars,
    parse_visible_devices,
    run_with_mask,
    run_with_masks,
    visible_gpus,
)
from .machinery.info import show_setup
from .machinery.launch import launch
from .machinery.launch_output import LaunchResult
from .machinery.ports import free_port, loopback_interface, port_is_free
from .machinery.processes import end_processes, launched_processes
from .machinery.saving import save_cells, write_next

# Modules notebooks reach as d2lpar.X after `import d2lpar` (d2lpar.distributed.expand_nodelist, ...).
from . import distributed, memory, saving  # noqa: E402,F401

__version__ = '0.1.0'
