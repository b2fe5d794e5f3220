"""d2lpar: the support package of a notebook course on multi-GPU training."""
from .data import (TensorLoader, data_root, fashion_mnist_source, get_fashion_mnist_labels,
                   load_data_fashion_mnist, offline)
from .devices import (device_slots, hardware_tier, num_gpus, small_workload, synchronize,
                      try_all_gpus, try_gpu)
from .info import show_setup
from .models import accuracy, evaluate_accuracy_gpu, init_lenet_params, lenet
from .parallel import allreduce, get_params, scatter, split_batch
from .plotting import Animator
from .timing import Accumulator, Timer

# Modules of later notebooks (one import line each, in notebook order).

__version__ = '0.1.0'
