"""d2lpar: the support package of a notebook course on multi-GPU training."""
from .data import (TensorLoader, data_root, fashion_mnist_source, get_fashion_mnist_labels,
                   load_data_fashion_mnist, offline)
from .devices import (device_slots, env_flag, gpu_problem, hardware_tier, num_gpus,
                      small_workload, synchronize, try_all_gpus, try_gpu)
from .info import show_setup
from .models import Residual, accuracy, evaluate_accuracy_gpu, init_lenet_params, lenet
from .parallel import allreduce, get_params, scatter, split_batch
from .plotting import Animator
from .saving import save_cells
from .timing import Accumulator, Timer

# Modules of later notebooks (one import line each, in notebook order).
from .visibility import choose_gpu, misspelled_cuda_vars, parse_visible_devices, run_with_mask, run_with_masks, visible_gpus
from .dataparallel import HandDataParallel, Replica, data_parallel, gather, load_state_dict_flexible, parallel_apply, replicate, save_checkpoint, scatter_inputs
from .pipeline import ModelParallel, StageLinks, bubble_fraction, gpipe_stage, gpipe_step, idle_fraction, memory_footprint, pipeline_schedule, plot_schedule, schedule_problems
from .launch import LaunchResult, end_processes, free_port, launch, launched_processes, loopback_interface, port_is_free
from .training import TrainResult, sgd, train, train_batch
from .miniddp import BucketDDP, HookDDP, MiniDDP

__version__ = '0.1.0'
