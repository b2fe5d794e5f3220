"""What the ranks of a row's script must hand back: the facts its notebook asserts (5-9, 14)."""

import functools
import math
import os
import re
import sys

from . import SCRIPTS


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
    _expect(sorted(found) == list(range(nproc)), f'{what} from ranks {sorted(found)}, expected 0-{nproc - 1}')
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
    sampler, train_iter = make_loader(common.make_dataset(num_samples, seed), batch_size, 1, 0, seed)
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
        _expect(
            r['synced'] == run[0]['init'], f'rank {rank} did not start from rank 0\'s parameters (DDP\'s broadcast)'
        )
        _expect(r['final'] == run[0]['final'], f'rank {rank} ended on other parameters')
        _expect(r['losses'] == run[0]['losses'], f'rank {rank} reports other losses')
    _expect(_close(run[0]['init'], init, 0, 0), 'rank 0 did not start as one process does')
    _expect(
        _close(run[0]['final'], final),
        'the parameters differ from one process\'s by '
        f'{max(abs(a - b) for a, b in zip(_flat(run[0]["final"]), final)):.1e}',
    )
    _expect(
        sorted(run[0]['losses']) == sorted(losses) and all(abs(run[0]['losses'][e] - losses[e]) < 1e-5 for e in losses),
        f'losses {run[0]["losses"]}, one process {losses}',
    )


def _check_restart(records, log, nproc, epochs, fail_at):
    """Notebook 6's facts: killed once, resumed at the lost epoch, ended as one process."""
    _check_ddp([r for r in records if 'final' in r], log, nproc, epochs)
    done = _ranks(records, nproc, 'final')
    _expect({r['attempt'] for r in done.values()} == {1}, 'not finished on the 2nd attempt')
    _expect(
        {r['first_epoch'] for r in done.values()} == {fail_at},
        f'resumed at epochs {[r["first_epoch"] for r in done.values()]}, not {fail_at}',
    )
    _expect(f'killed at the end of epoch {fail_at + 1}' in log, 'rank 0 was never killed')


def _check_hello(records, log, nproc):
    """Notebook 6's facts: all_reduce gives 1 + ... + n; NCCL_DEBUG=INFO printed NCCL's setup."""
    for rank, r in _ranks(records, nproc, 'total').items():
        _expect(
            r['total'] == nproc * (nproc + 1) / 2,
            f'rank {rank}: all_reduce gave {r["total"]}, not {nproc * (nproc + 1) // 2}',
        )
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
        _expect('Y' in r['syncbn'], f'rank {rank}: nn.SyncBatchNorm failed: {r["syncbn"].get("error")}')
        rows = len(r['X'])
        _expect(
            _close(r['syncbn']['Y'], want[start : start + rows]),
            f'rank {rank}: nn.SyncBatchNorm differs from BatchNorm over the global batch',
        )
        _expect(
            _close(r['Y'], want[start : start + rows]),
            f'rank {rank}: the by-hand synchronised BatchNorm differs from BatchNorm over the global batch',
        )
        start += rows
        _expect(r['converted'] == ['Linear', 'SyncBatchNorm'], f'converted {r["converted"]}')
        _expect(
            r['unused_error'] is not None and r['unused_error_with_find'] is None,
            f'rank {rank}: find_unused_parameters errors {r["unused_error"]!r}, {r["unused_error_with_find"]!r}',
        )


def _check_practice(records, log, nproc):
    """Notebook 7's facts on each part: fp16, compression, compile, join, evaluation, profile."""

    def part(name):
        return _ranks([r for r in records if r.get('part') == name], nproc, 'part', f'part {name!r}')

    _expect(all(r['backend'] == 'nccl' for r in part('done').values()), 'not on nccl')
    for rank, r in part('accumulate').items():
        _expect(
            r['calls_no_sync'] == r['buckets'] and r['calls_every'] == r['k'] * r['buckets'],
            f'rank {rank}: no_sync allreduce counts {r["calls_no_sync"]}, {r["calls_every"]}',
        )
        _expect(
            max(r['diff_vs_reference'], r['diff_vs_big_batch'], r['diff_every_vs_reference']) < 1e-6
            and r['moved'] > 1e-3,
            f'rank {rank}: accumulation differs from one big batch',
        )
    for rank, r in part('amp').items():
        _expect(
            r['dtype'] == r['out_dtype'] == 'torch.float16',
            f'rank {rank}: autocast computed in {r["out_dtype"]}, not float16',
        )
        _expect(r['loss_dtype'] == r['grad_dtype'] == 'torch.float32', f'rank {rank}: loss or gradients not float32')
        _expect(
            abs(r['loss16'] - r['loss32']) < 1e-2 * abs(r['loss32']) and 0 < r['grad_rel_err'] < 0.1,
            f'rank {rank}: float16 loss {r["loss16"]} vs {r["loss32"]}, gradient error {r["grad_rel_err"]}',
        )
        _expect(
            r['hook'] == 'fp16_compress_hook'
            and 2 * r['compressed_bytes'] == r['plain_bytes']
            and r['calls'] == r['compressed_calls'] > 0,
            f'rank {rank}: compression hook {r["hook"]} sent {r["compressed_bytes"]} of {r["plain_bytes"]} bytes',
        )
        _expect(
            r['diff_compressed'] < 0.05 * r['moved'] and r['diff_mixed'] < 0.05 * r['moved'],
            f'rank {rank}: compressed or mixed-precision training drifted',
        )
    for rank, r in part('compile').items():
        _expect(
            r['backend'] == 'inductor'
            and r['graphs_without'] == [r['layers']]
            and sum(r['graphs_with_optimizer']) == r['layers']
            and len(r['graphs_with_optimizer']) >= 2,
            f'rank {rank}: compiled graphs {r["graphs_with_optimizer"]}, {r["graphs_without"]}',
        )
        _expect(
            r['out_diff'] < 1e-4 and r['grad_diff'] < 1e-4,
            f'rank {rank}: inductor differs from eager by {r["out_diff"]}, {r["grad_diff"]}',
        )
    for rank, r in part('join').items():
        _expect(
            r['steps'] == r['counts'][rank] == 3 + 2 * rank and r['diff'] < 1e-6 and r['moved'] > 1e-3,
            f'rank {rank}: join trained {r["steps"]} steps, off by {r["diff"]}',
        )
    for rank, r in part('evaluate').items():
        _expect(
            (r['correct'], r['total']) == (r['single_correct'], r['n']),
            f'rank {rank}: accuracy {r["correct"]}/{r["total"]}, one process {r["single_correct"]}/{r["n"]}',
        )
    for rank, r in part('profile').items():
        _expect(
            len(r['report']) == r['steps']
            and all(s['allreduces'] >= 2 for s in r['report'])
            and all(s['first_launch'] < s['last_grad_start'] for s in r['report']),
            f'rank {rank}: the profile shows no overlapped allreduces: {r["report"]}',
        )
        _expect(os.path.isfile(r['trace']), f'rank {rank}: no trace at {r["trace"]}')
    for rank, r in part('loader').items():
        _expect(
            r['pinned'] and r['param_device'] == f'cuda:{rank}',
            f'rank {rank}: loader pinned {r["pinned"]}, parameters on {r["param_device"]}',
        )


def _check_standalone(records, log, nproc, epochs):
    """Notebook 6's facts: every epoch printed, by rank 0, on NCCL, loss going down."""
    lines = re.findall(r'epoch (\d+): loss ([\d.]+) \((\d+) processes, (\w+)\)', log)
    _expect([int(e) for e, *_ in lines] == list(range(epochs)), f'epochs printed {lines}')
    _expect({(n, b) for _, _, n, b in lines} == {(str(nproc), 'nccl')}, f'ran as {lines}')
    _expect(float(lines[-1][1]) < float(lines[0][1]), f'the loss did not go down: {lines}')


def _check_miniddp(records, log, nproc, variants=6):
    """Notebook 9's facts (the script asserts them too): every variant = DDP = one process."""
    for rank, r in _ranks(records, nproc, 'max_diff').items():
        _expect(
            r['backend'] == 'nccl' and r['device'] == f'cuda:{rank}',
            f'rank {rank} ran on {r["backend"]}, {r["device"]}',
        )
        diffs = list(r['max_diff'].values()) + list(r['max_diff_single'].values())
        _expect(
            len(r['max_diff']) == variants and max(diffs) < 1e-5,
            f'rank {rank}: {len(r["max_diff"])} variants, differences {diffs}',
        )
        for name, calls in r['allreduce_calls'].items():  # per step
            want = r['param_tensors'] if name == 'HookDDP' else len(r['buckets'][name])
            _expect(calls == want, f'rank {rank}: {name} made {calls} allreduces a step, not {want}')


def _check_context_parallel(records, log, nproc):
    """Notebook 15's fact: context_parallel on CUDA = full attention (not "not supported")."""
    for rank, r in _ranks(records, nproc, 'supported').items():
        _expect(r['supported'], f'rank {rank}: context_parallel not supported: {r.get("message")}')
        _expect(r['device'] == f'cuda:{rank}', f'rank {rank} ran on {r["device"]}')
        _expect(
            len(r['errors']) == 4 and max(r['errors']) < 1e-4,
            f'rank {rank}: differs from full attention by {r["errors"]}',
        )


def _check_flight_recorder(records, log):
    """Notebook 6's fact: rank 0's dump shows the all_reduce it hung in."""
    _expect(
        "rank 0's last collective, an all_reduce, never completed" in log,
        'the flight recorder did not show rank 0 stuck in its all_reduce',
    )


def _check_pytest_ran(records, log):
    """The GPU tests ran (pytest exits 0 when every test is skipped)."""
    ran = re.search(r'(\d+) passed', log)
    _expect(ran and int(ran.group(1)) > 0, 'no test ran (all skipped?)')


def _check_scale_fit(records, log, nproc):
    """Notebook 17's prediction: the bytes of live tensors at the step's peak, within 5% + 64 MiB.

    The fake run equals CPU processes to the byte and the predictor is within 0.1% of it; on a
    GPU the allocator rounds each block up to 512 bytes and cuBLAS keeps workspaces (tens of MiB).
    """
    from d2lpar import scale

    for rank, r in _ranks(records, nproc, 'max_allocated').items():
        predicted = scale.predict(r['cfg'], r['world_size'], r['batch'], r['seq_len'], ac=r['ac'])['peak']
        measured = r['max_allocated']
        _expect(
            abs(measured - predicted) <= 0.05 * predicted + 64 * 2**20,
            f'rank {rank}: max_memory_allocated {measured / 2**20:.1f} MiB, predicted {predicted / 2**20:.1f} MiB',
        )
