"""Verify the course on a machine with GPUs, in one command, without editing any file.

    make gpucheck                                    # every row this machine can run
    make gpucheck GPUCHECK_FLAGS=--quick             # what one GPU can prove, in minutes
    make gpucheck GPUCHECK_FLAGS="--rows 05,nccl"    # rows whose name contains 05 or nccl
    python verify/gpucheck.py --list                 # the rows, and how many GPUs each needs

Each row is one check: a notebook executed in its folder (at full size, as a learner runs
it, or at the small workload in the quick rows), or a GPU-only run that no notebook makes on
every machine (NCCL, float16 with GradScaler, compression hooks, inductor, FSDP2, tensor and
pipeline parallelism, restarts, the flight recorder). A GPU-only row passes only when what
its ranks report is what the notebook asserts (its check function), not merely when it
exits 0. A row that needs more GPUs than CUDA can use here is marked `SKIPPED (needs N GPUs)`.

Before any row, gpucheck asks the driver how many GPUs it has (nvidia-smi, /proc/driver/
nvidia): when the driver lists GPUs that torch cannot use (most often a torch built for a
newer CUDA than the driver), it stops with the reason and the fix (exit status 2); on a
machine with no GPU at all it stops too (exit status 3: it would verify no GPU path), unless
--allow-cpu. Each row's verdict and seconds print as the row finishes (and go to
build/gpucheck/summary.tsv), its output to build/gpucheck/ROW.log; the end is one table
under the machine's GPU facts. Exit status 1 when a row failed. Notebooks run offline
(D2LPAR_OFFLINE=1, the stand-in data) unless --online.

A script that a notebook writes with `%%writefile {work}/NAME.py` (notebooks 10-13) is run
by a row of its own, which is also a command:

    python verify/gpucheck.py script notebooks/12_tensor_parallel.ipynb tp_block.py \
        --nproc 2 --backend nccl --device cuda -- --steps 20

It runs the notebook's first code cell, its `#@save` cells and that `%%writefile` cell in a
kernel (nothing else: the rest is the notebook row's to check), with TMPDIR in a scratch
folder so that the notebook's work folder lands there; launches the script written there with
torchrun (PYTHONPATH work:ROOT, as the notebook's launch has it); and checks what the ranks
handed back with the facts the notebook asserts after its own launch.
"""
import argparse
import functools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
SCRIPTS = NOTEBOOKS / 'scripts'
PORT = '{free_port}'  # in a row's argv: replaced by a free port when the row starts
# Notebooks whose single-process cells take a GPU branch on one GPU (the others, on one GPU,
# run exactly what they run on the CPU: their multi-process parts need a GPU per rank).
ONE_GPU_NOTEBOOKS = ('01_single_device', '02_visible_devices', '03_data_parallel',
                     '04_model_parallel', '08_lenet_data_parallel')


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
    estimate: int = None  # seconds on one H100 with 16 cores: an ESTIMATE, not a measurement


def _python(*args):
    return [sys.executable, *map(str, args)]


def _torchrun(nproc, script, *args):
    return _python('-m', 'torch.distributed.run', '--standalone', f'--nproc-per-node={nproc}',
                   SCRIPTS / script, *args)


# Notebook 11's script: the parts that run on any number of GPUs (placements and reshard
# expect 4 ranks; hsdp an even number; prefetch and meta_init, which compares the ranks' blocks,
# more than one).
FSDP_PARTS = ('train_like_one_process', 'mixed', 'clipping', 'offload', 'save')

def _script_row(name, notebook, script, nproc, scratch, *args, quick=False, estimate=None,
                timeout=1800):
    """A row that runs `script` as `notebook` writes it, on `nproc` GPUs with NCCL."""
    folder = scratch / (script.removesuffix('.py') + f'-{nproc}')
    return Row(('quick: ' if quick else '') + f'nccl {notebook} {script}: {name}'
               + (', 1 rank' if nproc == 1 else ''),
               nproc, quick=quick, estimate=estimate, timeout=timeout,
               argv=_python(__file__, 'script', NOTEBOOKS / f'{notebook}.ipynb', script,
                            '--nproc', nproc, '--backend', 'nccl', '--device', 'cuda',
                            '--scratch', folder, '--', *args))


def rows(scratch):
    """Return every row, notebooks first, in course order; `scratch` holds per-row files."""
    table = [Row(f'notebook {p.stem}', notebook=p)
             for p in sorted(NOTEBOOKS.glob('[0-9][0-9]_*.ipynb'))]
    ddp = functools.partial(_check_ddp, epochs=4)
    table += [
        Row('nccl ddp: torchrun, 2 processes, one GPU each', 2,
            argv=_torchrun(2, 'ddp_torchrun.py', '--backend', 'nccl', '--epochs', '4'),
            check=functools.partial(ddp, nproc=2)),
        Row('nccl ddp: mp.spawn, 2 processes', 2,
            argv=_python(SCRIPTS / 'ddp_spawn.py', '--nproc', '2', '--backend', 'nccl',
                         '--init-method', f'tcp://127.0.0.1:{PORT}'),
            check=functools.partial(ddp, nproc=2)),
        Row('nccl hello with NCCL_DEBUG=INFO', 2, env={'NCCL_DEBUG': 'INFO'},
            argv=_torchrun(2, 'hello_dist.py', '--backend', 'nccl'),
            check=functools.partial(_check_hello, nproc=2)),
        Row('nccl SyncBatchNorm and DDP arguments (ddp_anatomy)', 2,
            argv=_torchrun(2, 'ddp_anatomy.py', '--backend', 'nccl'),
            check=functools.partial(_check_anatomy, nproc=2)),
        Row('nccl fp16 GradScaler, fp16 compression hook, inductor compile, profiler', 2,
            argv=_torchrun(2, 'ddp_practice.py', '--backend', 'nccl', '--parts', 'all',
                           '--trace-dir', scratch / 'trace', '--compile-backend', 'inductor'),
            check=functools.partial(_check_practice, nproc=2)),
        Row('nccl restart: a rank fails, resumed from a fresh snapshot', 2,
            argv=_python('-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2',
                         '--max-restarts=1', SCRIPTS / 'ddp_restart.py', '--backend', 'nccl',
                         '--snapshot', scratch / 'snapshot.pt', '--fail-at-epoch', '1'),
            check=functools.partial(_check_restart, nproc=2, epochs=4, fail_at=1)),
        Row('nccl standalone DDP script (imports only torch)', 2,
            argv=_torchrun(2, 'ddp_standalone.py', '--epochs', '3', '--ckpt', scratch / 's.pt'),
            check=functools.partial(_check_standalone, nproc=2, epochs=3)),
        Row('nccl mini-DDP (hooks, buckets, overlap)', 2, env={'PYTHONPATH': str(ROOT)},
            argv=_torchrun(2, 'collectives_miniddp.py', '--variant', 'hook', 'buckets',
                           'overlap', '--buckets', '0.25', 'inf', '--check-steps', '3',
                           '--time-steps', '10'),
            check=functools.partial(_check_miniddp, nproc=2)),
        Row('nccl context_parallel against full attention', 2,
            argv=_torchrun(2, 'context_parallel_torch.py'),
            check=functools.partial(_check_context_parallel, nproc=2)),
        Row('nccl flight recorder: a skipped collective, dumped and read by fr_trace', 2,
            argv=_python(SCRIPTS / 'nccl_flight_recorder.py', '--dump-dir', scratch / 'fr'),
            check=_check_flight_recorder),
        # The scripts notebooks 10-13 write, with the notebook's own arguments at full size.
        _script_row('ZeRO by hand', '10_zero', 'measure_zero.py', 2, scratch,
                    '--width', '256', '--layers', '6'),
        _script_row('FSDP2, checkpoint', '11_fsdp2', 'fsdp_save.py', 2, scratch,
                    *FSDP_PARTS, 'meta_init', 'hsdp', 'prefetch', '--folder', '{work}/checkpoint'),
        _script_row('Megatron, sequence parallel', '12_tensor_parallel',
                    'tp_block.py', 2, scratch, '--steps', '20'),
        _script_row('DTensor plans, loss_parallel', '12_tensor_parallel',
                    'tp_dtensor.py', 2, scratch),
        _script_row('five schedules', '13_pipeline_parallel', 'pp_schedules.py', 2,
                    scratch, '--microbatches', '8', '--ms', '20', '--batch', '32'),
        _script_row('pp x FSDP2 x tp', '13_pipeline_parallel',
                    'parallel_3d.py', 8, scratch, '--steps', '10'),
        Row('pytest: the tests that need two GPUs', 2,
            argv=_python('-m', 'pytest', '-q', '-p', 'no:xdist', '-rs',
                         ROOT / 'tests/test_dataparallel.py', ROOT / 'tests/test_pipeline.py',
                         '-k', 'on_gpus or two_gpus'),
            check=_check_pytest_ran),
        Row('mask: notebook 02 under CUDA_VISIBLE_DEVICES=1,0', 2,
            notebook=NOTEBOOKS / '02_visible_devices.ipynb', env={'CUDA_VISIBLE_DEVICES': '1,0'}),
        # With exactly one GPU this is the row `notebook 05_ddp` again: only with 2 or more.
        Row('one GPU visible: notebook 05 under CUDA_VISIBLE_DEVICES=0', 2,
            notebook=NOTEBOOKS / '05_ddp.ipynb', env={'CUDA_VISIBLE_DEVICES': '0'}),
    ]
    return table + quick_rows(scratch)


def quick_rows(scratch):
    """The rows of --quick: what one GPU can prove, each row's seconds ESTIMATED (not measured).

    The estimates are for one H100 with 16 CPU cores, from the CPU timings of the same work
    (the test suite's per-notebook seconds, a torchrun start of about 10 s, inductor's
    compile of a few kernels); they sum to 479 s, under 8 minutes. `--budget` (default 480 s with
    --quick) bounds the whole run: rows not started by then are reported NOT RUN.
    """
    one = functools.partial(Row, needs=1, quick=True, timeout=240)
    table = [one(f'quick: notebook {stem}, small workload', notebook=NOTEBOOKS / f'{stem}.ipynb',
                 env={'D2LPAR_SMALL': '1'}, estimate=30) for stem in ONE_GPU_NOTEBOOKS]
    table += [
        one('quick: nccl ddp, torchrun, 1 rank, against one process', estimate=15,
            argv=_torchrun(1, 'ddp_torchrun.py', '--backend', 'nccl', '--epochs', '4'),
            check=functools.partial(_check_ddp, nproc=1, epochs=4)),
        one('quick: nccl SyncBatchNorm (ddp_anatomy), 1 rank', estimate=15,
            argv=_torchrun(1, 'ddp_anatomy.py', '--backend', 'nccl'),
            check=functools.partial(_check_anatomy, nproc=1)),
        one('quick: nccl fp16, GradScaler, hooks, profiler on CUDA, inductor on CUDA, 1 rank',
            estimate=90, timeout=300,
            argv=_torchrun(1, 'ddp_practice.py', '--backend', 'nccl', '--parts', 'all',
                           '--trace-dir', scratch / 'trace-1', '--compile-backend', 'inductor'),
            check=functools.partial(_check_practice, nproc=1)),
        one('quick: nccl mini-DDP (hooks, buckets, overlap), 1 rank', estimate=20,
            env={'PYTHONPATH': str(ROOT)},
            argv=_torchrun(1, 'collectives_miniddp.py', '--variant', 'hook', 'buckets',
                           'overlap', '--buckets', '0.25', 'inf', '--check-steps', '3',
                           '--time-steps', '3'),
            check=functools.partial(_check_miniddp, nproc=1)),
        one('quick: nccl context_parallel on CUDA attention, 1 rank', estimate=15,
            argv=_torchrun(1, 'context_parallel_torch.py'),
            check=functools.partial(_check_context_parallel, nproc=1)),
        _script_row('ZeRO by hand', '10_zero', 'measure_zero.py', 1, scratch,
                    '--width', '256', '--layers', '6', quick=True, estimate=40, timeout=240),
        _script_row('FSDP2, CPU offload, checkpoint', '11_fsdp2', 'fsdp_save.py', 1, scratch,
                    *FSDP_PARTS, '--folder', '{work}/checkpoint', quick=True, estimate=60,
                    timeout=300),
        _script_row('Megatron by hand', '12_tensor_parallel', 'tp_block.py', 1, scratch,
                    '--steps', '5', quick=True, estimate=30, timeout=240),
        _script_row('DTensor plans, loss_parallel', '12_tensor_parallel', 'tp_dtensor.py', 1,
                    scratch, quick=True, estimate=30, timeout=240),
    ]
    return table + _scale_rows()


def _scale_rows():
    """Notebook 16's memory prediction against torch.cuda.max_memory_allocated (verify/scale_fit_cuda.py)."""
    return [Row('quick: scale.predict against max_memory_allocated, FSDP2 step of a small Llama, 1 rank',
                needs=1, quick=True, timeout=240, estimate=14, env={'PYTHONPATH': str(ROOT)},
                argv=_python('-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=1',
                             ROOT / 'verify' / 'scale_fit_cuda.py'),
                check=functools.partial(_check_scale_fit, nproc=1))]


def _check_scale_fit(records, log, nproc):
    """Notebook 16's prediction: the bytes of live tensors at the step's peak, within 5% + 64 MiB.

    The fake run equals CPU processes to the byte and the predictor is within 0.1% of it; on a
    GPU the allocator rounds each block up to 512 bytes and cuBLAS keeps workspaces (tens of MiB).
    """
    from d2lpar import scale
    for rank, r in _ranks(records, nproc, 'max_allocated').items():
        predicted = scale.predict(r['cfg'], r['world_size'], r['batch'], r['seq_len'], ac=r['ac'])['peak']
        measured = r['max_allocated']
        _expect(abs(measured - predicted) <= 0.05 * predicted + 64 * 2**20,
                f'rank {rank}: max_memory_allocated {measured / 2**20:.1f} MiB, predicted '
                f'{predicted / 2**20:.1f} MiB')


class CheckFailed(Exception):
    """What the ranks of a script handed back is not what its notebook asserts."""


def _expect(ok, what):
    if not ok:
        raise CheckFailed(what)


def _ranks(records, nproc, key, what=None):
    """Return {rank: record} of the records holding `key`; exactly one per rank 0..nproc-1."""
    what = what or repr(key)
    found = {}
    for r in records:
        if key in r:
            _expect(r['rank'] not in found, f'rank {r["rank"]} reported {what} twice')
            found[r['rank']] = r
    _expect(sorted(found) == list(range(nproc)),
            f'{what} from ranks {sorted(found)}, expected 0-{nproc - 1}')
    return found


def _flat(value):
    return [x for v in value for x in _flat(v)] if isinstance(value, list) else [value]


def _close(a, b, rtol=1e-4, atol=1e-5):
    """notebook 5's tolerance: the same arithmetic, rounded in another order (or on a GPU)."""
    a, b = _flat(a), _flat(b)
    return len(a) == len(b) and all(abs(x - y) <= atol + rtol * abs(y) for x, y in zip(a, b))


@functools.lru_cache(maxsize=None)
def _one_process_ddp(epochs, batch_size=32, num_samples=512, lr=0.05, seed=0):
    """Notebook 5's reference, train_single.py on the CPU: (init, final, {epoch: loss})."""
    import torch
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    import common
    from d2lpar.ddp import make_loader, train_ddp
    torch.manual_seed(seed)
    net = common.make_net()
    init = common.flat_params(net).tolist()
    sampler, train_iter = make_loader(common.make_dataset(num_samples, seed), batch_size, 1, 0,
                                      seed)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    losses = train_ddp(net, sampler, train_iter, optimizer, torch.device('cpu'), epochs)
    return init, common.flat_params(net).tolist(), {str(k): v for k, v in losses.items()}


def _check_ddp(records, log, nproc, epochs, backend='nccl'):
    """Notebook 5's facts: replicas start and end equal, and train as one process does."""
    run = _ranks(records, nproc, 'final')
    init, final, losses = _one_process_ddp(epochs)
    for rank, r in run.items():
        _expect(r['backend'] == backend, f'rank {rank} ran on {r["backend"]}, not {backend}')
        _expect(r['replica_gap'] == 0, f'rank {rank}: replicas differ by {r["replica_gap"]}')
        _expect(r['synced'] == run[0]['init'], f'rank {rank} did not start from rank 0\'s '
                'parameters (DDP\'s broadcast)')
        _expect(r['final'] == run[0]['final'], f'rank {rank} ended on other parameters')
        _expect(r['losses'] == run[0]['losses'], f'rank {rank} reports other losses')
    _expect(_close(run[0]['init'], init, 0, 0), 'rank 0 did not start as one process does')
    _expect(_close(run[0]['final'], final), 'the parameters differ from one process\'s by '
            f'{max(abs(a - b) for a, b in zip(_flat(run[0]["final"]), final)):.1e}')
    _expect(sorted(run[0]['losses']) == sorted(losses) and all(
        abs(run[0]['losses'][e] - losses[e]) < 1e-5 for e in losses),
        f'losses {run[0]["losses"]}, one process {losses}')


def _check_restart(records, log, nproc, epochs, fail_at):
    """Notebook 6's facts: killed once, resumed at the lost epoch, ended as one process."""
    _check_ddp([r for r in records if 'final' in r], log, nproc, epochs)
    done = _ranks(records, nproc, 'final')
    _expect({r['attempt'] for r in done.values()} == {1}, 'not finished on the 2nd attempt')
    _expect({r['first_epoch'] for r in done.values()} == {fail_at},
            f'resumed at epochs {[r["first_epoch"] for r in done.values()]}, not {fail_at}')
    _expect(f'killed at the end of epoch {fail_at + 1}' in log, 'rank 0 was never killed')


def _check_hello(records, log, nproc):
    """Notebook 6's facts: all_reduce gives 1 + ... + n; NCCL_DEBUG=INFO printed NCCL's setup."""
    for rank, r in _ranks(records, nproc, 'total').items():
        _expect(r['total'] == nproc * (nproc + 1) / 2, f'rank {rank}: all_reduce gave '
                f'{r["total"]}, not {nproc * (nproc + 1) // 2}')
    _expect('NCCL INFO' in log, 'no "NCCL INFO" line: NCCL_DEBUG=INFO did not reach NCCL')


def _batchnorm(X):
    mean = [sum(col) / len(col) for col in zip(*X)]
    var = [sum((x - m) ** 2 for x in col) / len(col) for col, m in zip(zip(*X), mean)]
    return [[(x - m) / math.sqrt(v + 1e-5) for x, m, v in zip(row, mean, var)] for row in X]


def _check_anatomy(records, log, nproc):
    """Notebook 5's facts: nn.SyncBatchNorm on the GPUs = BatchNorm over the global batch."""
    parts = _ranks(records, nproc, 'syncbn')
    X = [row for r in range(nproc) for row in parts[r]['X']]  # rank 0's rows first
    want = _batchnorm(X)
    start = 0
    for rank in range(nproc):
        r = parts[rank]
        _expect(r['backend'] == 'nccl', f'rank {rank} ran on {r["backend"]}')
        _expect('Y' in r['syncbn'], f'rank {rank}: nn.SyncBatchNorm failed: '
                f'{r["syncbn"].get("error")}')
        rows = len(r['X'])
        _expect(_close(r['syncbn']['Y'], want[start:start + rows]), f'rank {rank}: '
                'nn.SyncBatchNorm differs from BatchNorm over the global batch')
        _expect(_close(r['Y'], want[start:start + rows]), f'rank {rank}: the by-hand '
                'synchronised BatchNorm differs from BatchNorm over the global batch')
        start += rows
        _expect(r['converted'] == ['Linear', 'SyncBatchNorm'], f'converted {r["converted"]}')
        _expect(r['unused_error'] is not None and r['unused_error_with_find'] is None,
                f'rank {rank}: find_unused_parameters errors {r["unused_error"]!r}, '
                f'{r["unused_error_with_find"]!r}')


def _check_practice(records, log, nproc):
    """Notebook 7's facts on each part: fp16, compression, compile, join, evaluation, profile."""
    def part(name):
        return _ranks([r for r in records if r.get('part') == name], nproc, 'part',
                      f'part {name!r}')

    _expect(all(r['backend'] == 'nccl' for r in part('done').values()), 'not on nccl')
    for rank, r in part('accumulate').items():
        _expect(r['calls_no_sync'] == r['buckets'] and r['calls_every'] == r['k'] * r['buckets'],
                f'rank {rank}: no_sync allreduce counts {r["calls_no_sync"]}, {r["calls_every"]}')
        _expect(max(r['diff_vs_reference'], r['diff_vs_big_batch'],
                    r['diff_every_vs_reference']) < 1e-6 and r['moved'] > 1e-3,
                f'rank {rank}: accumulation differs from one big batch')
    for rank, r in part('amp').items():
        _expect(r['dtype'] == r['out_dtype'] == 'torch.float16', f'rank {rank}: autocast '
                f'computed in {r["out_dtype"]}, not float16')
        _expect(r['loss_dtype'] == r['grad_dtype'] == 'torch.float32', f'rank {rank}: loss or '
                'gradients not float32')
        _expect(abs(r['loss16'] - r['loss32']) < 1e-2 * abs(r['loss32'])
                and 0 < r['grad_rel_err'] < 0.1, f'rank {rank}: float16 loss {r["loss16"]} vs '
                f'{r["loss32"]}, gradient error {r["grad_rel_err"]}')
        _expect(r['hook'] == 'fp16_compress_hook' and 2 * r['compressed_bytes'] == r['plain_bytes']
                and r['calls'] == r['compressed_calls'] > 0, f'rank {rank}: compression hook '
                f'{r["hook"]} sent {r["compressed_bytes"]} of {r["plain_bytes"]} bytes')
        _expect(r['diff_compressed'] < 0.05 * r['moved'] and r['diff_mixed'] < 0.05 * r['moved'],
                f'rank {rank}: compressed or mixed-precision training drifted')
    for rank, r in part('compile').items():
        _expect(r['backend'] == 'inductor' and r['graphs_without'] == [r['layers']]
                and sum(r['graphs_with_optimizer']) == r['layers']
                and len(r['graphs_with_optimizer']) >= 2, f'rank {rank}: compiled graphs '
                f'{r["graphs_with_optimizer"]}, {r["graphs_without"]}')
        _expect(r['out_diff'] < 1e-4 and r['grad_diff'] < 1e-4, f'rank {rank}: inductor '
                f'differs from eager by {r["out_diff"]}, {r["grad_diff"]}')
    for rank, r in part('join').items():
        _expect(r['steps'] == r['counts'][rank] == 3 + 2 * rank and r['diff'] < 1e-6
                and r['moved'] > 1e-3, f'rank {rank}: join trained {r["steps"]} steps, off by '
                f'{r["diff"]}')
    for rank, r in part('evaluate').items():
        _expect((r['correct'], r['total']) == (r['single_correct'], r['n']),
                f'rank {rank}: accuracy {r["correct"]}/{r["total"]}, one process '
                f'{r["single_correct"]}/{r["n"]}')
    for rank, r in part('profile').items():
        _expect(len(r['report']) == r['steps'] and all(s['allreduces'] >= 2 for s in r['report'])
                and all(s['first_launch'] < s['last_grad_start'] for s in r['report']),
                f'rank {rank}: the profile shows no overlapped allreduces: {r["report"]}')
        _expect(os.path.isfile(r['trace']), f'rank {rank}: no trace at {r["trace"]}')
    for rank, r in part('loader').items():
        _expect(r['pinned'] and r['param_device'] == f'cuda:{rank}',
                f'rank {rank}: loader pinned {r["pinned"]}, parameters on {r["param_device"]}')


def _check_standalone(records, log, nproc, epochs):
    """Notebook 6's facts: every epoch printed, by rank 0, on NCCL, loss going down."""
    lines = re.findall(r'epoch (\d+): loss ([\d.]+) \((\d+) processes, (\w+)\)', log)
    _expect([int(e) for e, *_ in lines] == list(range(epochs)), f'epochs printed {lines}')
    _expect({(n, b) for _, _, n, b in lines} == {(str(nproc), 'nccl')}, f'ran as {lines}')
    _expect(float(lines[-1][1]) < float(lines[0][1]), f'the loss did not go down: {lines}')


def _check_miniddp(records, log, nproc, variants=6):
    """Notebook 9's facts (the script asserts them too): every variant = DDP = one process."""
    for rank, r in _ranks(records, nproc, 'max_diff').items():
        _expect(r['backend'] == 'nccl' and r['device'] == f'cuda:{rank}',
                f'rank {rank} ran on {r["backend"]}, {r["device"]}')
        diffs = list(r['max_diff'].values()) + list(r['max_diff_single'].values())
        _expect(len(r['max_diff']) == variants and max(diffs) < 1e-5,
                f'rank {rank}: {len(r["max_diff"])} variants, differences {diffs}')
        for name, calls in r['allreduce_calls'].items():  # per step
            want = r['param_tensors'] if name == 'HookDDP' else len(r['buckets'][name])
            _expect(calls == want, f'rank {rank}: {name} made {calls} allreduces a step, '
                    f'not {want}')


def _check_context_parallel(records, log, nproc):
    """Notebook 14's fact: context_parallel on CUDA = full attention (not "not supported")."""
    for rank, r in _ranks(records, nproc, 'supported').items():
        _expect(r['supported'], f'rank {rank}: context_parallel not supported: '
                f'{r.get("message")}')
        _expect(r['device'] == f'cuda:{rank}', f'rank {rank} ran on {r["device"]}')
        _expect(len(r['errors']) == 4 and max(r['errors']) < 1e-4, f'rank {rank}: differs '
                f'from full attention by {r["errors"]}')


def _check_flight_recorder(records, log):
    """Notebook 6's fact: rank 0's dump shows the all_reduce it hung in."""
    _expect("rank 0's last collective, an all_reduce, never completed" in log,
            'the flight recorder did not show rank 0 stuck in its all_reduce')


def _check_pytest_ran(records, log):
    """The GPU tests ran (pytest exits 0 when every test is skipped)."""
    ran = re.search(r'(\d+) passed', log)
    _expect(ran and int(ran.group(1)) > 0, 'no test ran (all skipped?)')


def _check_tp_block(results, args):
    """Notebook 12's facts after tp_block.py: equal to one process, four all-reduces."""
    for rank, r in results.items():
        for name in ('megatron', 'sp'):
            worst = max(r[name]['out'], r[name]['x_grad'], r[name]['grads'])
            _expect(worst < 1e-5, f'rank {rank}: {name} differs from one process by {worst:.1e}')
        if len(results) > 1:  # one rank sees every token: its partial gradient is the whole
            _expect(r['sp']['partial'] > 0.1, f'rank {rank}: a norm gradient before the sum '
                    'equals the whole one (the ranks did not see different tokens)')
        calls = {k: c for k, (c, _) in r['megatron']['calls'].items()}
        _expect(calls == {'all_reduce': 4}, f'rank {rank}: Megatron collectives {calls}')
        _expect(r['overlap_equal'], f'rank {rank}: overlapped backward changed the gradients')


def _check_tp_dtensor(results, args):
    """Notebook 12's facts after tp_dtensor.py: DTensor plans = Megatron by hand = one process."""
    for rank, r in results.items():
        lp = r['loss_parallel']
        diffs = [r['tp']['diff'], r['sp']['diff'], lp['grads'], abs(lp['loss'] - lp['want'])]
        _expect(max(diffs) < 1e-5, f'rank {rank}: differences {diffs}')
        if len(results) == 1:  # one rank: DTensor issues no collective at all (seen: {})
            continue
        _expect(r['tp']['collectives'] == {'all_reduce': 6},
                f"rank {rank}: tensor-parallel collectives {r['tp']['collectives']}")
        _expect(r['sp']['collectives'] == {'all_gather_into_tensor': 4,
                                           'reduce_scatter_tensor': 4},
                f"rank {rank}: sequence-parallel collectives {r['sp']['collectives']}")


def _one_process_pp(batch):
    """Notebook 13's reference: its network and batch trained unsplit; (loss, flat gradients)."""
    import torch
    from torch import nn
    torch.manual_seed(0)  # the script's make_net(): Linear-ReLU pairs, then a Linear
    layers = [nn.Linear(64, 32), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(32, 10))
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
    loss = nn.functional.cross_entropy(net(X), y)
    loss.backward()
    return loss.item(), [x for q in net.parameters() for x in q.grad.flatten().tolist()]


def _check_pp_schedules(results, args):
    """Notebook 13's facts after pp_schedules.py: every schedule = one process, in-flight peaks."""
    p = len(results)
    batch = int(args[args.index('--batch') + 1]) if '--batch' in args else 32
    want_loss, want = _one_process_pp(batch)
    m = sum(1 for e in results[0]['GPipe']['events'] if e[2] == 'F' and e[0] == 0)
    for name in [k for k, v in results[0].items() if isinstance(v, dict)]:  # the schedules
        by_stage = {i: g for r in results.values() for i, g in r[name]['grads'].items()}
        got = [x for i in sorted(by_stage, key=int) for t in by_stage[i] for x in _flatten(t)]
        _expect(len(got) == len(want) and max(abs(x - y) for x, y in zip(got, want)) < 1e-5,
                f'{name}: gradients differ from one process\'s')
        losses = [r[name]['loss'] for r in results.values() if r[name]['loss'] is not None]
        _expect(len(losses) == 1 and abs(losses[0] - want_loss) < 1e-5,
                f'{name}: last-stage losses {losses}, one process {want_loss:.5f}')
        _expect(all(r[name]['alive_after'] == 0 for r in results.values()),
                f'{name}: activations still held after the step')
    peaks = {name: [results[r][name]['peak_in_flight'] for r in range(p)] for name in ('GPipe', '1F1B')}
    _expect(peaks['GPipe'] == [m] * p, f'GPipe holds {peaks["GPipe"]} micro-batches, not {m}')
    _expect(peaks['1F1B'] == [p - r for r in range(p)], f'1F1B holds {peaks["1F1B"]}')


def _check_parallel_3d(results, args):
    """Notebook 13's facts after parallel_3d.py: 3D = one process within rounding."""
    r = results[0]
    sizes = r['sizes']
    tolerance = sizes['LR'] * r['steps'] * sizes['B'] * sizes['T'] * sizes['H'] * 2.0 ** -23
    _expect(sorted((r['pp'], r['dp'], r['tp']) for r in results.values()) ==
            [(a, b, c) for a in range(2) for b in range(2) for c in range(2)], 'mesh coordinates')
    for rank, r in results.items():
        _expect(r['max_diff'] < tolerance < r['moved'] / 100,
                f"rank {rank}: off by {r['max_diff']:.1e}, tolerance {tolerance:.1e}, "
                f"moved {r['moved']:.1e}")
    rows = [results[rank]['mlp0_rows'] for rank in range(4)]
    _expect(rows == [[0, 8], [16, 24], [8, 16], [24, 32]], f'mlp.0 rows held {rows}')


def _flatten(value):
    if isinstance(value, list):
        return [x for v in value for x in _flatten(v)]
    return [value]


def _check_measure_zero(results, args):
    """Notebook 10's facts after measure_zero.py (which asserts parity with one process itself):
    the bytes each rank sent per stage, and peaks that fall stage by stage."""
    n = len(results)
    for rank, r in results.items():
        passes = {'DDP': 2, 'ZeRO-1': 2, 'ZeRO-2': 2, 'ZeRO-3': 3}
        for stage, k in passes.items():
            want = k * (n - 1) / n * r['num_params'] * 4
            _expect(r['sent'][stage] == want, f"rank {rank}: {stage} sent {r['sent'][stage]} B, "
                    f'the ring sends {want:.0f}')
        peaks = [r['peak'][stage] for stage in passes]
        _expect(peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4,
                f'rank {rank}: peaks {peaks} do not fall from DDP to ZeRO-3')


def _check_fsdp_save(results, args):
    """Notebook 11's script asserts each part itself; every rank must have come through all of
    them (a rank that stops early hands nothing back), with prefetch's timeline if it ran."""
    _expect(len(results) >= 1, 'no rank handed back a result')
    for rank, r in results.items():
        if 'prefetch' in args:
            _expect(set(r.get('prefetch', {})) == {'False', 'True'},
                    f'rank {rank}: no prefetch timelines handed back')


# What each script's notebook asserts after launching it (the scripts of notebooks 10 and 11
# also assert these themselves, and exit non-zero when one fails).
CHECKS = {'measure_zero.py': _check_measure_zero, 'fsdp_save.py': _check_fsdp_save,
          'tp_block.py': _check_tp_block, 'tp_dtensor.py': _check_tp_dtensor,
          'pp_schedules.py': _check_pp_schedules, 'parallel_3d.py': _check_parallel_3d}


def prepare_script(notebook, script, tmpdir):
    """Write `script` as `notebook` does; return the notebook's work folder under `tmpdir`.

    Runs the notebook's first code cell (which makes `work` with tempfile.mkdtemp and calls
    save_cells), its `#@save` cells and the cell that writes `{work}/SCRIPT`, in that order: a
    `%%writefile {work}/SCRIPT` cell, or `d2lpar.write_next(work / 'OLD', work / 'SCRIPT', diff)`
    together with every earlier cell that writes a script (the versions it grows from).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = Path(notebook).resolve()
    nb = nbformat.read(notebook, as_version=4)
    code = [c for c in nb.cells if c.cell_type == 'code']
    header = f'%%writefile {{work}}/{script}\n'
    grown = 'd2lpar.write_next(work / '
    writes = [c.source.startswith(header) or (c.source.startswith(grown) and
              f"work / '{script}'" in c.source.partition('\n')[0]) for c in code]
    target = next((i for i, w in enumerate(writes) if w), None)
    if target is None:
        raise SystemExit(f'gpucheck script: {notebook.name} has no cell starting with '
                         f'{header.strip()!r} or writing it with d2lpar.write_next; check the '
                         'script name')
    nb.cells = [c for i, c in enumerate(code[:target + 1])
                if i in (0, target) or c.source.lstrip().startswith('#@save')
                or (code[target].source.startswith(grown)
                    and c.source.startswith(('%%writefile', grown)))]
    # Small: these cells only define and write; the script's own arguments set its size.
    env = dict(os.environ, TMPDIR=str(tmpdir), D2LPAR_SMALL='1')
    env.pop('MPLBACKEND', None)
    env.pop('PYTEST_CURRENT_TEST', None)
    client = NotebookClient(nb, timeout=600, kernel_name='python3',
                            resources={'metadata': {'path': str(notebook.parent)}})
    with client.setup_kernel(env=env, cwd=str(notebook.parent)):
        for index, cell in enumerate(nb.cells):
            try:
                client.execute_cell(cell, index)
            except CellExecutionError as e:
                raise SystemExit(f'gpucheck script: preparing {script} from {notebook.name}: '
                                 f'{e.ename}: {e.evalue}') from None
    written = sorted(Path(tmpdir).glob(f'*/{script}'))
    if len(written) != 1:
        raise SystemExit(f'gpucheck script: expected {notebook.name} to write one {script} '
                         f'under {tmpdir}, found {[str(w) for w in written]}')
    return written[0].parent


def run_script(argv):
    """`gpucheck.py script NOTEBOOK SCRIPT ...`: prepare, launch, check; return the exit status."""
    parser = argparse.ArgumentParser(
        prog='gpucheck.py script',
        description='Run a script as a notebook writes it (%%writefile {work}/SCRIPT) under '
                    'torchrun, and check what its ranks hand back.')
    parser.add_argument('notebook', type=Path)
    parser.add_argument('script', help='file name of the %%writefile cell, e.g. tp_block.py')
    parser.add_argument('--nproc', type=int, default=2)
    parser.add_argument('--backend', choices=['gloo', 'nccl'], default='nccl')
    parser.add_argument('--device', choices=['cpu', 'cuda'], default='cuda')
    parser.add_argument('--scratch', type=Path, default=None,
                        help='folder for the notebook\'s work folder and the results '
                             '(default: a fresh temporary folder, removed at the end)')
    parser.epilog = ('After --, the script\'s own arguments; {work} in them stands for the folder '
                     'the notebook wrote the script in.')
    ours, script_args = (argv[:argv.index('--')], argv[argv.index('--') + 1:]) if '--' in argv \
        else (argv, [])
    args = parser.parse_args(ours)
    args.args = script_args
    # gpucheck ends a row with SIGTERM: leave through `finally` (the kernel shut down, the
    # scratch folder removed); torchrun, in the same process group, gets it too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if not args.notebook.is_file():
        parser.error(f'no notebook {args.notebook}')
    if args.backend == 'nccl' or args.device == 'cuda':
        import d2lpar
        gpus = d2lpar.num_gpus()
        if args.nproc > gpus:
            parser.error(f'--nproc {args.nproc} with --backend nccl --device cuda needs one GPU '
                         f'per rank, and CUDA can use {gpus} here'
                         + (f' ({d2lpar.gpu_problem()})' if d2lpar.gpu_problem() else '')
                         + f'; use --nproc {gpus}' * (gpus > 0)
                         + ' or --backend gloo --device cpu')
    own = args.scratch is None
    scratch = Path(tempfile.mkdtemp(prefix='d2lpar-gpucheck-script-')) if own else args.scratch
    try:
        tmpdir, results_dir = scratch / 'tmp', scratch / 'results'
        tmpdir.mkdir(parents=True)
        results_dir.mkdir()
        work = prepare_script(args.notebook, args.script, tmpdir)
        print(f'{args.notebook.name} wrote {work / args.script}', flush=True)
        env = dict(os.environ, TMPDIR=str(tmpdir), D2LPAR_RESULT_DIR=str(results_dir),
                   PYTHONPATH=os.pathsep.join([str(work), str(ROOT)] + [
                       p for p in [os.environ.get('PYTHONPATH')] if p]))
        launch = _python('-m', 'torch.distributed.run', '--standalone',
                         f'--nproc-per-node={args.nproc}', work / args.script,
                         '--backend', args.backend, '--device', args.device,
                         *(a.replace('{work}', str(work)) for a in args.args))
        print('$', ' '.join(launch), flush=True)
        proc = subprocess.Popen(launch, cwd=work, env=env)
        try:
            code = proc.wait()
        finally:
            if proc.poll() is None:  # interrupted: torchrun ends its workers on SIGTERM only
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if code != 0:
            print(f'{args.script} exited with status {code}')
            return 1
        results = {}
        for f in sorted(results_dir.glob('*.json')):
            record = json.loads(f.read_text())
            results[record['rank']] = record
        try:
            _expect(sorted(results) == list(range(args.nproc)),
                    f'results from ranks {sorted(results)}, expected 0-{args.nproc - 1}')
            check = CHECKS.get(args.script)
            if check:
                check(results, args.args)
        except CheckFailed as e:
            print(f'{args.script}: check failed: {e}')
            return 1
        print(f'{args.script} on {args.nproc} processes ({args.backend}, {args.device}): '
              + ('checked: ' + check.__doc__.split(':', 1)[1].strip() if check
                 else 'every rank handed back its result'))
        return 0
    finally:
        if own:
            shutil.rmtree(scratch, ignore_errors=True)


def gpu_facts(driver=None):
    """Return lines describing the GPUs, the driver and the torch, CUDA and NCCL builds."""
    import torch
    import d2lpar
    driver = driver or driver_gpus()
    lines = [f'torch {torch.__version__}, CUDA {torch.version.cuda or "none"}, '
             f'NCCL {".".join(map(str, torch.cuda.nccl.version())) if d2lpar.num_gpus() else "-"}']
    for i in range(d2lpar.num_gpus()):
        props = torch.cuda.get_device_properties(i)
        lines.append(f'cuda:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB')
    lines.append(f'driver: {driver["summary"]}')
    problem = d2lpar.gpu_problem()
    lines.append(f'GPUs CUDA can use: {d2lpar.num_gpus()}' + (f' ({problem})' if problem else ''))
    return lines


def driver_gpus(smi='nvidia-smi', proc=Path('/proc/driver/nvidia/gpus')):
    """Ask the NVIDIA driver, not torch, about the GPUs: {'count', 'version', 'cuda', 'summary'}.

    `nvidia-smi -L` lists one line per GPU ("GPU 0: ..."), and its plain output's header
    names the newest CUDA the driver runs ("CUDA Version: 12.4"); /proc/driver/nvidia/gpus
    holds one folder per GPU. A GPU either of them sees counts.
    """
    found = {'count': 0, 'version': None, 'cuda': None, 'exclusive': False}
    exe = shutil.which(smi)
    if exe:
        def ask(*args):
            try:
                return subprocess.run([exe, *args], capture_output=True, text=True,
                                      timeout=60).stdout
            except (OSError, subprocess.TimeoutExpired):
                return ''
        found['count'] = sum(1 for line in ask('-L').splitlines() if line.startswith('GPU '))
        header = ask()
        version = re.search(r'Driver Version:\s*([\d.]+)', header)
        cuda = re.search(r'CUDA Version:\s*([\d.]+)', header)
        found['version'], found['cuda'] = version and version.group(1), cuda and cuda.group(1)
        modes = ask('--query-gpu=compute_mode', '--format=csv,noheader').split()
        found['exclusive'] = any('Exclusive' in m for m in modes)
    try:
        found['count'] = max(found['count'], sum(1 for p in Path(proc).iterdir()))
    except OSError:
        pass
    found['summary'] = (f'{found["count"]} GPU(s) listed by the NVIDIA driver'
                        + (f' {found["version"]}' if found['version'] else '')
                        + (f', which runs CUDA up to {found["cuda"]}' if found['cuda'] else '')
                        + (', in EXCLUSIVE_PROCESS compute mode' if found['exclusive'] else '')
                        if found['count'] else 'no NVIDIA GPU (nvidia-smi and '
                        '/proc/driver/nvidia list none)')
    return found


def preflight(driver, usable, torch_cuda, torch_version, visible, allow_cpu):
    """Return (exit status, message) before any row: 0 when gpucheck can verify GPU paths.

    `driver` is driver_gpus()'s answer, `usable` the GPUs CUDA can use (num_gpus()),
    `torch_cuda` torch.version.cuda, `visible` CUDA_VISIBLE_DEVICES (None when unset).
    """
    if usable > 0:
        return 0, None
    if driver['count'] == 0:
        if allow_cpu:
            return 0, ('no GPU here (--allow-cpu): the rows a CPU can run verify no GPU path; '
                       'every GPU row is SKIPPED')
        return 3, ('gpucheck: no GPU here (nvidia-smi and /proc/driver/nvidia list none), so it '
                   'would verify no GPU path. Run it on a machine with NVIDIA GPUs, or pass '
                   '--allow-cpu to run the rows a CPU can.')
    head = (f'gpucheck: the NVIDIA driver lists {driver["count"]} GPU(s), but torch '
            f'{torch_version} can use none of them, so every GPU row would be skipped and the '
            'run would verify nothing. ')
    if visible is not None:
        return 2, head + (f'CUDA_VISIBLE_DEVICES={visible!r} hides them (torch reads "", "-1" '
                          'or an invalid entry as no GPU). Fix: unset it, or list GPU indices '
                          'such as CUDA_VISIBLE_DEVICES=0,1.')
    if not torch_cuda:
        return 2, head + ('This torch is a CPU-only build. Fix: install a CUDA build of torch '
                          '2.13 or newer for the driver\'s CUDA' + (
                              f' ({driver["cuda"]} or older)' if driver['cuda'] else '')
                          + ' in this environment (the command on pytorch.org/get-started/'
                          'locally; its index URLs look like '
                          'https://download.pytorch.org/whl/cu126), then run gpucheck again.')
    newer = driver['cuda'] and tuple(map(int, driver['cuda'].split('.')[:2])) < tuple(
        map(int, torch_cuda.split('.')[:2]))
    reason = (f'This torch is built for CUDA {torch_cuda}, and the driver'
              + (f' {driver["version"]}' if driver['version'] else '')
              + (f' runs CUDA up to {driver["cuda"]}' if driver['cuda'] else '')
              + (': CUDA cannot start. ' if newer else
                 ': CUDA did not start (torch\'s "CUDA initialization" warning says why). '))
    return 2, head + reason + (
        'Fix, either: (1) install a driver that runs CUDA ' + torch_cuda + ' or newer; or (2) '
        'install a torch 2.13 or newer built for CUDA ' + (driver['cuda'] or 'your driver\'s')
        + ' or older into this environment (pytorch.org/get-started/locally gives the command; '
        'its index URLs look like https://download.pytorch.org/whl/cu126), then run '
        f'`{Path(sys.executable).name} verify/gpucheck.py` with that environment\'s python '
        '(make gpucheck installs the newest torch into .venv).')


def _end(proc):
    """End `proc`'s session: SIGTERM first (torchrun then stops its workers), then SIGKILL."""
    from d2lpar.processes import end_processes, launched_processes
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    end_processes(launched_processes())  # ranks of a d2lpar.launch inside a notebook row


def _read_results(folder):
    records = []
    for f in sorted(Path(folder).glob('*.json')):
        records.append(json.loads(f.read_text()))
    return records


def run_row(row, log, results_dir, online=False):
    """Run one row, writing its output to `log`; return (ok, seconds, note)."""
    from d2lpar.launch import free_port
    env = dict(os.environ)
    env.pop('D2LPAR_SMALL', None)  # full size, as a learner runs it, unless the row says
    if not online:  # no download (it has no timeout): the announced stand-in data
        env['D2LPAR_OFFLINE'] = '1'
    env.update(row.env)
    if row.check is not None:
        shutil.rmtree(results_dir, ignore_errors=True)
        Path(results_dir).mkdir(parents=True)
        env['D2LPAR_RESULT_DIR'] = str(results_dir)  # what the ranks hand back, to check
    start = time.perf_counter()
    if row.notebook is not None:
        # A child process, so that a row's CUDA_VISIBLE_DEVICES applies before CUDA starts.
        code = ('import sys; from d2lpar.render import execute_notebook; '
                'nb, setup, s, error = execute_notebook(sys.argv[1], timeout=int(sys.argv[2])); '
                'print(setup); print(error or "ok"); sys.exit(1 if error else 0)')
        argv = _python('-c', code, row.notebook, row.timeout)
    else:
        port = str(free_port()) if any(PORT in str(a) for a in row.argv) else None
        argv = [str(a).replace(PORT, port) if port else a for a in row.argv]
    with open(log, 'w') as out:
        # In a session of its own, so that a timeout or Ctrl-C ends the row's whole tree.
        proc = subprocess.Popen(argv, cwd=NOTEBOOKS, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=row.timeout)
            ok, note = proc.returncode == 0, f'exit {proc.returncode}'
        except subprocess.TimeoutExpired:
            ok, note = False, f'timed out after {row.timeout} s'
        finally:
            _end(proc)
    seconds = time.perf_counter() - start
    text = Path(log).read_text(errors='replace')
    if ok and row.check is not None:
        try:
            row.check(_read_results(results_dir), text)
            note = 'checked'
        except CheckFailed as e:
            ok, note = False, f'check failed: {e}'
        except (KeyError, TypeError, ValueError, IndexError) as e:  # a record lacks a field
            ok, note = False, f'check failed: results malformed ({type(e).__name__}: {e})'
    if not ok and not note.startswith('check failed'):
        tail = text.strip().splitlines()[-1:] or ['']
        note = f'{note}: {tail[0][:100]}'
    return ok, seconds, note


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ['script']:
        return run_script(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rows', default='', help='comma-separated parts of row names to run')
    parser.add_argument('--quick', action='store_true',
                        help='only the rows one GPU can prove, in minutes (their names start '
                             'with "quick"; --list --quick shows each one\'s estimated seconds)')
    parser.add_argument('--budget', type=float, default=None,
                        help='start no row after this many seconds (default 480 with --quick)')
    parser.add_argument('--list', action='store_true', help='list the rows and exit')
    parser.add_argument('--allow-cpu', action='store_true',
                        help='on a machine with no GPU, run the rows a CPU can (verifies no '
                             'GPU path) instead of stopping with exit status 3')
    parser.add_argument('--online', action='store_true',
                        help='let notebooks download Fashion-MNIST (default: offline stand-in)')
    parser.add_argument('--logs', default=str(ROOT / 'build' / 'gpucheck'),
                        help='folder for each row\'s output, the traces and summary.tsv '
                             '(default build/gpucheck)')
    args = parser.parse_args(argv)
    if args.budget is None and args.quick:
        args.budget = 480
    logs = Path(args.logs).resolve()
    # Files rows write (snapshots) go to a fresh folder, removed at the end: every run
    # starts from nothing, so a restart row really restarts. Traces stay under --logs.
    scratch = Path(tempfile.gettempdir()) / f'd2lpar-gpucheck-{os.getpid()}'
    table = [r for r in rows(scratch) if r.quick == args.quick]
    for row in table:  # the profiler's Chrome traces, kept for GPU_CHECKLIST item 5
        row.argv = [logs / Path(a).name if isinstance(a, Path) and a.name.startswith('trace')
                    else a for a in row.argv]
    wanted = [w.strip() for w in args.rows.split(',') if w.strip()]
    if wanted:
        table = [r for r in table if any(w in r.name for w in wanted)]
        if not table:
            parser.error(f'--rows {args.rows!r} matches no row; see --list')
    if args.list:
        for row in table:
            estimate = f'  (about {row.estimate} s, estimated)' if row.estimate else ''
            print(f'{row.needs} GPU(s)  {row.name}{estimate}')
        if args.quick:
            print(f'estimated total: {sum(r.estimate or 0 for r in table)} s on one H100 '
                  '(an estimate, not a measurement)')
        return 0
    import torch
    import d2lpar
    gpus = d2lpar.num_gpus()
    driver = driver_gpus()
    status, message = preflight(driver, gpus, torch.version.cuda, torch.__version__,
                                os.environ.get('CUDA_VISIBLE_DEVICES'), args.allow_cpu)
    if message:
        print(('ERROR ' if status else '') + message, file=sys.stderr if status else sys.stdout,
              flush=True)
    if status:
        print('\n'.join(gpu_facts(driver)), file=sys.stderr)
        return status
    if driver['exclusive']:
        print('note: the GPUs are in EXCLUSIVE_PROCESS compute mode: rows that put several '
              'processes on one GPU (notebook 2 on one GPU, device slots sharing a GPU) fail '
              'there; ask for the DEFAULT compute mode (nvidia-smi -c DEFAULT, as root)', flush=True)
    # Stopped by `timeout` or a job scheduler: leave through the `finally`s, which end the row's
    # processes and remove the scratch folder.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    logs.mkdir(parents=True, exist_ok=True)
    summary = logs / 'summary.tsv'
    summary.write_text('row\tresult\tseconds\n')
    scratch.mkdir()
    results = []
    started = time.monotonic()
    try:
        for k, row in enumerate(table):
            if row.needs > gpus:
                result, seconds = f'SKIPPED (needs {row.needs} GPUs)', None
            elif args.budget is not None and time.monotonic() - started > args.budget:
                result, seconds = f'NOT RUN (past the {args.budget:.0f} s budget)', None
            else:
                print(f'[{k + 1}/{len(table)}] {row.name} ...', flush=True)
                slug = ''.join(c if c.isalnum() else '_' for c in row.name)[:60]
                log = logs / (slug + '.log')
                ok, seconds, note = run_row(row, log, scratch / 'results' / slug, args.online)
                result = 'PASS' if ok else f'FAIL ({note}; see {log})'
            results.append((row.name, result, seconds))
            if seconds is None:
                print(f'[{k + 1}/{len(table)}] {row.name}: {result}', flush=True)
            else:  # each verdict as soon as it is known: an interrupted run shows what ran
                print(f'    {result} ({seconds:.0f} s)', flush=True)
            with open(summary, 'a') as f:
                f.write(f'{row.name}\t{result}\t{"" if seconds is None else f"{seconds:.1f}"}\n')
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print('\n' + '\n'.join(gpu_facts(driver)) + '\n')
    width = max(len(name) for name, _, _ in results)
    for name, result, seconds in results:
        print(f'{name:{width}}  {"" if seconds is None else f"{seconds:6.0f} s"}  {result}')
    failed = sum(r.startswith('FAIL') for _, r, _ in results)
    ran = sum(s is not None for _, _, s in results)
    print(f'\n{ran - failed} passed, {failed} failed, {len(results) - ran} skipped or not run'
          f' ({time.monotonic() - started:.0f} s)')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
