"""The table of `make gpucheck`: every row, and the rows of --quick."""

import functools
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import GPUCHECK, NOTEBOOKS, PORT, ROOT, SCRIPTS
from .checks import (
    _check_anatomy,
    _check_context_parallel,
    _check_ddp,
    _check_flight_recorder,
    _check_hello,
    _check_miniddp,
    _check_practice,
    _check_pytest_ran,
    _check_restart,
    _check_scale_fit,
    _check_standalone,
)

# Notebooks whose single-process cells take a GPU branch on one GPU (the others, on one GPU,
# run exactly what they run on the CPU: their multi-process parts need a GPU per rank).
ONE_GPU_NOTEBOOKS = (
    '01_single_device',
    '02_visible_devices',
    '03_data_parallel',
    '04_model_parallel',
    '08_lenet_data_parallel',
)


@dataclass
class Row:
    """One check: `notebook` executed, or `argv` run from notebooks/ and its results checked."""

    name: str
    needs: int = 0  # GPUs that CUDA must be able to use
    notebook: Path = None
    argv: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    timeout: int = 1800  # seconds for the whole row
    # check(records, log): raise CheckFailed unless the ranks' results (emit_result records,
    # all of them) and the row's output say what the notebook asserts. None: the row checks
    # itself (a notebook's asserts, or a script that exits non-zero on a wrong number).
    check: object = None
    quick: bool = False  # one of the rows of --quick
    estimate: int = None  # seconds on one GPU: measured on an H200 where the row ran there (quick_rows)


def _python(*args):
    return [sys.executable, *map(str, args)]


def _command(*args):
    """Return `python` and `args`, each string split as a shell would split it, each path kept whole."""
    return _python(*(w for a in args for w in (shlex.split(a) if isinstance(a, str) else [a])))


def _torchrun(nproc, script, *args):
    return _command('-m torch.distributed.run --standalone', f'--nproc-per-node={nproc}', SCRIPTS / script, *args)


# Notebook 11's script: the parts that run on any number of GPUs (placements and reshard
# expect 4 ranks; hsdp an even number; prefetch and meta_init, which compares the ranks' blocks,
# more than one).
FSDP_PARTS = 'train_like_one_process mixed clipping offload save'


def _script_row(name, notebook, script, nproc, scratch, args='', quick=False, estimate=None, timeout=1800):
    """A row that runs `script` as `notebook` writes it, on `nproc` GPUs with NCCL, with `args` after `--`."""
    folder = scratch / (script.removesuffix('.py') + f'-{nproc}')
    notebook_path = NOTEBOOKS / f'{notebook}.ipynb'
    return Row(
        ('quick: ' if quick else '') + f'nccl {notebook} {script}: {name}' + (', 1 rank' if nproc == 1 else ''),
        nproc,
        quick=quick,
        estimate=estimate,
        timeout=timeout,
        argv=_command(GPUCHECK, 'script', notebook_path, script, f'--nproc {nproc} --backend nccl --device cuda',
                     '--scratch', folder, '--', args),
    )  # fmt: skip


def rows(scratch):
    """Return every row, notebooks first, in course order; `scratch` holds per-row files."""
    table = [Row(f'notebook {p.stem}', notebook=p) for p in sorted(NOTEBOOKS.glob('[0-9][0-9]_*.ipynb'))]
    ddp = functools.partial(_check_ddp, epochs=4)
    spawn = f'--nproc 2 --backend nccl --init-method tcp://127.0.0.1:{PORT}'
    miniddp = '--variant hook buckets overlap --buckets 0.25 inf --check-steps 3 --time-steps 10'
    two_gpu_tests = ROOT / 'tests/test_dataparallel.py', ROOT / 'tests/test_pipeline.py'
    table += [
        Row('nccl ddp: torchrun, 2 processes, one GPU each', 2,
            argv=_torchrun(2, 'ddp_torchrun.py', '--backend nccl --epochs 4'),
            check=functools.partial(ddp, nproc=2)),
        Row('nccl ddp: mp.spawn, 2 processes', 2,
            argv=_command(SCRIPTS / 'ddp_spawn.py', spawn),
            check=functools.partial(ddp, nproc=2)),
        Row('nccl hello with NCCL_DEBUG=INFO', 2, env={'NCCL_DEBUG': 'INFO'},
            argv=_torchrun(2, 'hello_dist.py', '--backend nccl'),
            check=functools.partial(_check_hello, nproc=2)),
        Row('nccl SyncBatchNorm and DDP arguments (ddp_anatomy)', 2,
            argv=_torchrun(2, 'ddp_anatomy.py', '--backend nccl'),
            check=functools.partial(_check_anatomy, nproc=2)),
        Row('nccl fp16 GradScaler, fp16 compression hook, inductor compile, profiler', 2,
            argv=_torchrun(2, 'ddp_practice.py', '--backend nccl --parts all --trace-dir', scratch / 'trace',
                           '--compile-backend inductor'),
            check=functools.partial(_check_practice, nproc=2)),
        Row('nccl restart: a rank fails, resumed from a fresh snapshot', 2,
            argv=_command('-m torch.distributed.run --standalone --nproc-per-node=2 --max-restarts=1',
                         SCRIPTS / 'ddp_restart.py', '--backend nccl --snapshot', scratch / 'snapshot.pt',
                         '--fail-at-epoch 1'),
            check=functools.partial(_check_restart, nproc=2, epochs=4, fail_at=1)),
        Row('nccl standalone DDP script (imports only torch)', 2,
            argv=_torchrun(2, 'ddp_standalone.py', '--epochs 3 --ckpt', scratch / 's.pt'),
            check=functools.partial(_check_standalone, nproc=2, epochs=3)),
        Row('nccl mini-DDP (hooks, buckets, overlap)', 2, env={'PYTHONPATH': str(ROOT)},
            argv=_torchrun(2, 'collectives_miniddp.py', miniddp),
            check=functools.partial(_check_miniddp, nproc=2)),
        Row('nccl context_parallel against full attention', 2,
            argv=_torchrun(2, 'context_parallel_torch.py'),
            check=functools.partial(_check_context_parallel, nproc=2)),
        Row('nccl flight recorder: a skipped collective, dumped and read by fr_trace', 2,
            argv=_command(SCRIPTS / 'nccl_flight_recorder.py', '--dump-dir', scratch / 'fr'),
            check=_check_flight_recorder),
        # The scripts notebooks 10-14 write, with the notebook's own arguments at full size.
        _script_row('ZeRO by hand', '10_zero', 'measure_zero.py', 2, scratch, '--width 256 --layers 6'),
        _script_row('FSDP2, checkpoint', '11_fsdp2', 'fsdp_save.py', 2, scratch,
                    f'{FSDP_PARTS} meta_init hsdp prefetch --folder {{work}}/checkpoint'),
        _script_row('Megatron, overlap, sequence parallel', '12_tensor_parallel', 'tp_sp.py', 2, scratch),
        _script_row('DTensor plans, loss_parallel', '13_tensor_parallel_dtensor', 'tp_loss.py', 2, scratch),
        _script_row('bytes and MFU per strategy', '13_tensor_parallel_dtensor', 'tp_mfu.py', 2, scratch,
                    '--steps 20'),
        _script_row('five schedules', '14_pipeline_parallel', 'pp_schedules.py', 2, scratch,
                    '--microbatches 8 --ms 20 --batch 32'),
        _script_row('pp x FSDP2 x tp', '14_pipeline_parallel', 'parallel_3d.py', 8, scratch, '--steps 10'),
        Row('pytest: the tests that need two GPUs', 2,
            argv=_command('-m pytest -q -p no:xdist -rs', *two_gpu_tests, "-k 'on_gpus or two_gpus'"),
            check=_check_pytest_ran),
        Row('mask: notebook 02 under CUDA_VISIBLE_DEVICES=1,0', 2,
            notebook=NOTEBOOKS / '02_visible_devices.ipynb', env={'CUDA_VISIBLE_DEVICES': '1,0'}),
        # With exactly one GPU this is the row `notebook 05_ddp` again: only with 2 or more.
        Row('one GPU visible: notebook 05 under CUDA_VISIBLE_DEVICES=0', 2,
            notebook=NOTEBOOKS / '05_ddp.ipynb', env={'CUDA_VISIBLE_DEVICES': '0'}),
    ]  # fmt: skip
    return table + quick_rows(scratch)


def quick_rows(scratch):
    """The rows of --quick: what one GPU can prove, with each row's seconds.

    Seconds as measured on one H200 with 16 CPU cores (2026-11-28, torch 2.11, README) where
    the row ran to its end there; the rest (fsdp_save stopped early, the tensor-parallel
    scripts changed since) are estimates from the CPU timings of the same work. `--budget`
    (default 480 s with --quick) bounds the whole run: rows not started by then are NOT RUN.
    """
    one = functools.partial(Row, needs=1, quick=True, timeout=240)
    table = [
        one(f'quick: notebook {stem}, small workload', notebook=NOTEBOOKS / f'{stem}.ipynb',
            env={'D2LPAR_SMALL': '1'}, estimate=30)
        for stem in ONE_GPU_NOTEBOOKS
    ]  # fmt: skip
    miniddp = '--variant hook buckets overlap --buckets 0.25 inf --check-steps 3 --time-steps 3'
    script_row = functools.partial(_script_row, quick=True, timeout=240)
    scale_fit = ROOT / 'verify/scale_fit_cuda.py'
    table += [
        one('quick: nccl ddp, torchrun, 1 rank, against one process', estimate=12,
            argv=_torchrun(1, 'ddp_torchrun.py', '--backend nccl --epochs 4'),
            check=functools.partial(_check_ddp, nproc=1, epochs=4)),
        one('quick: nccl SyncBatchNorm (ddp_anatomy), 1 rank', estimate=13,
            argv=_torchrun(1, 'ddp_anatomy.py', '--backend nccl'),
            check=functools.partial(_check_anatomy, nproc=1)),
        one('quick: nccl fp16, GradScaler, hooks, profiler on CUDA, inductor on CUDA, 1 rank', estimate=20, timeout=300,
            argv=_torchrun(1, 'ddp_practice.py', '--backend nccl --parts all --trace-dir', scratch / 'trace-1',
                           '--compile-backend inductor'),
            check=functools.partial(_check_practice, nproc=1)),
        one('quick: nccl mini-DDP (hooks, buckets, overlap), 1 rank', estimate=14, env={'PYTHONPATH': str(ROOT)},
            argv=_torchrun(1, 'collectives_miniddp.py', miniddp),
            check=functools.partial(_check_miniddp, nproc=1)),
        one('quick: nccl context_parallel on CUDA attention, 1 rank', estimate=13,
            argv=_torchrun(1, 'context_parallel_torch.py'),
            check=functools.partial(_check_context_parallel, nproc=1)),
        script_row('ZeRO by hand', '10_zero', 'measure_zero.py', 1, scratch, '--width 256 --layers 6', estimate=25),
        script_row('FSDP2, CPU offload, checkpoint', '11_fsdp2', 'fsdp_save.py', 1, scratch,
                   f'{FSDP_PARTS} --folder {{work}}/checkpoint', estimate=60, timeout=300),
        script_row('Megatron, overlap, sequence parallel by hand', '12_tensor_parallel', 'tp_sp.py', 1, scratch,
                   estimate=30),
        script_row('DTensor plans, loss_parallel', '13_tensor_parallel_dtensor', 'tp_loss.py', 1, scratch,
                   estimate=30),
        # Notebook 17's memory prediction against torch.cuda.max_memory_allocated.
        one('quick: scale.predict against max_memory_allocated, FSDP2 step of a small Llama, 1 rank', estimate=19,
            env={'PYTHONPATH': str(ROOT)},
            argv=_command('-m torch.distributed.run --standalone --nproc-per-node=1', scale_fit),
            check=functools.partial(_check_scale_fit, nproc=1)),
    ]  # fmt: skip
    return table
