"""make gpucheck's check functions (verify/gpu/checks.py, script_checks.py): each fed the numbers the
ranks hand back when all is right, then the classic wrong ones."""

import functools

import pytest

from verify.gpu import checks, script_checks


def _fails(check, records, message, *args, **kwargs):
    with pytest.raises(checks.CheckFailed, match=message):
        check(records, *args, **kwargs)


def _ddp_records(nproc=2):
    """What ddp_torchrun.py's ranks hand back when DDP is right: one process's numbers."""
    init, final, losses = checks._one_process_ddp(4)
    return [
        dict(rank=r, backend='nccl', init=init if r == 0 else [x + 1 for x in init], synced=init, final=final,
             losses=dict(losses), replica_gap=0.0)
        for r in range(nproc)
    ]  # fmt: skip


def test_the_ddp_and_restart_checks_compare_with_one_process():
    check = functools.partial(checks._check_ddp, log='', nproc=2, epochs=4)
    check(_ddp_records())
    for edit, message in [
        (lambda rs: rs[0].update(backend='gloo'), 'ran on gloo'),
        (
            lambda rs: [r.update(final=[x * 1.01 for x in r['final']]) for r in rs],
            'differ from one process',
        ),  # e.g. gradients summed, not averaged
        (lambda rs: rs[1].update(replica_gap=1e-7), 'replicas differ'),
        (lambda rs: rs[1].update(synced=rs[1]['init']), "rank 0's parameters"),
        (lambda rs: rs.pop(), r"from ranks \[0\]"),
        (lambda rs: [r['losses'].update({'3': r['losses']['3'] + 1e-3}) for r in rs], 'losses'),
    ]:
        records = _ddp_records()
        edit(records)
        _fails(check, records, message)
    restart = functools.partial(checks._check_restart, nproc=2, epochs=4, fail_at=1)
    done = [dict(r, attempt=1, first_epoch=1) for r in _ddp_records()]
    log = 'rank 0: killed at the end of epoch 2\n'
    restart(done + [dict(rank=0, gloo_threads_after_destroy=[])], log)
    _fails(restart, done, 'never killed', '')
    _fails(restart, [dict(r, first_epoch=0) for r in done], 'resumed at epochs', log)
    _fails(restart, [dict(r, attempt=0) for r in done], '2nd attempt', log)


def test_the_syncbatchnorm_check_wants_the_global_batch_statistics():
    import torch

    g = torch.Generator().manual_seed(0)
    X = (torch.randn(8, 4, generator=g) * 3 + 1).tolist()
    Y = checks._batchnorm(X)

    def records(syncbn_rows):
        return [
            dict(rank=r, backend='nccl', X=X[4 * r : 4 * r + 4], Y=Y[4 * r : 4 * r + 4],
                 syncbn={'Y': syncbn_rows[4 * r : 4 * r + 4]}, converted=['Linear', 'SyncBatchNorm'],
                 unused_error='Expected to have finished reduction', unused_error_with_find=None)
            for r in range(2)
        ]  # fmt: skip

    checks._check_anatomy(records(Y), '', nproc=2)
    local = checks._batchnorm(X[:4]) + checks._batchnorm(X[4:])  # each rank's own batch
    _fails(checks._check_anatomy, records(local), 'nn.SyncBatchNorm differs', '', nproc=2)
    broken = records(Y)
    broken[1]['syncbn'] = {'error': 'ValueError: SyncBatchNorm expected input tensor on GPU'}
    _fails(checks._check_anatomy, broken, 'nn.SyncBatchNorm failed', '', nproc=2)


def _practice_records(trace):
    """What ddp_practice.py's ranks hand back on two GPUs when every part is right."""
    records = []
    for rank in range(2):
        records += [
            dict(rank=rank, part='accumulate', k=4, buckets=2, calls_no_sync=2, calls_every=8,
                 diff_vs_reference=1e-8, diff_vs_big_batch=1e-8, diff_every_vs_reference=1e-8, moved=0.05),
            dict(rank=rank, part='amp', dtype='torch.float16', out_dtype='torch.float16',
                 loss_dtype='torch.float32', grad_dtype='torch.float32', loss32=1.386, loss16=1.387,
                 grad_rel_err=0.002, hook='fp16_compress_hook', steps=20, plain_bytes=2 * 20 * 4 * 100,
                 compressed_bytes=20 * 4 * 100, calls=20, compressed_calls=20, params=100,
                 diff_compressed=1e-4, diff_mixed=2e-4, moved=0.1),
            dict(rank=rank, part='join', counts=[3, 5], steps=3 + 2 * rank, diff=1e-8, moved=0.1),
            dict(rank=rank, part='evaluate', n=101, correct=40, total=101, single_correct=40),
            dict(rank=rank, part='profile', trace=str(trace), steps=3,
                 report=[dict(allreduces=6, first_launch=1.0, last_grad_start=2.0)] * 3),
            dict(rank=rank, part='loader', pinned=True, param_device=f'cuda:{rank}'),
            dict(rank=rank, part='compile', backend='inductor', graphs_with_optimizer=[1, 1, 1, 1],
                 graphs_without=[4], graphs=4, layers=4, out_diff=1e-6, grad_diff=1e-6),
            dict(rank=rank, part='done', backend='nccl'),
        ]  # fmt: skip
    return records


def test_the_ddp_practice_check_catches_each_parts_wrong_numbers(tmp_path):
    trace = tmp_path / 'trace.json'
    trace.write_text('{}')
    check = functools.partial(checks._check_practice, log='', nproc=2)
    check(_practice_records(trace))
    for part, change, message in [
        ('amp', dict(out_dtype='torch.bfloat16'), 'not float16'),
        ('amp', dict(compressed_bytes=2 * 20 * 4 * 100), 'compression hook'),
        ('amp', dict(diff_mixed=0.5), 'drifted'),
        ('amp', dict(grad_rel_err=0.0), 'gradient error'),  # not really 16 bits
        ('accumulate', dict(calls_no_sync=8), 'no_sync allreduce counts'),
        ('compile', dict(grad_diff=0.1), 'inductor differs'),
        ('compile', dict(graphs_with_optimizer=[4]), 'compiled graphs'),
        ('join', dict(diff=1e-3), 'join trained'),
        ('evaluate', dict(total=102), 'accuracy'),  # the padded duplicate counted
        ('profile', dict(report=[dict(allreduces=6, first_launch=3.0, last_grad_start=2.0)] * 3), 'no overlapped'),
        ('loader', dict(param_device='cpu'), 'parameters on cpu'),
        ('done', dict(backend='gloo'), 'not on nccl'),
    ]:
        records = _practice_records(trace)
        next(r for r in records if r['part'] == part and r['rank'] == 1).update(change)
        _fails(check, records, message)
    _fails(check, [r for r in _practice_records(trace) if r['part'] != 'compile'], 'compile')


def test_the_other_row_checks_catch_wrong_numbers():
    log = '\n'.join(f'epoch {e}: loss {1 - e / 10:.4f} (2 processes, nccl)' for e in range(3))
    checks._check_standalone([], log, nproc=2, epochs=3)
    _fails(checks._check_standalone, [], 'ran as', log.replace('nccl', 'gloo'), nproc=2, epochs=3)
    _fails(checks._check_standalone, [], 'epochs printed', log.split('\n', 1)[1], nproc=2, epochs=3)
    _fails(checks._check_standalone, [], 'did not go down', log.replace('loss 0.8', 'loss 1.8'), nproc=2, epochs=3)

    def miniddp(**change):
        r = [
            dict(rank=k, backend='nccl', device=f'cuda:{k}', param_tensors=4,
                 max_diff={n: 1e-7 for n in ('DDP', 'HookDDP', 'B 0.25', 'B inf', 'O 0.25', 'O inf')},
                 max_diff_single={'DDP': 1e-7}, allreduce_calls={'HookDDP': 4, 'B 0.25': 2},
                 buckets={'HookDDP': [], 'B 0.25': [[0, 1], [2, 3]]})
            for k in range(2)
        ]  # fmt: skip
        r[1].update(change)
        return r

    checks._check_miniddp(miniddp(), '', nproc=2)
    _fails(checks._check_miniddp, miniddp(max_diff_single={'DDP': 1e-3}), 'differences', '', nproc=2)
    _fails(checks._check_miniddp, miniddp(allreduce_calls={'HookDDP': 8}), 'HookDDP made 8', '', nproc=2)
    _fails(checks._check_miniddp, miniddp(device='cpu', backend='gloo'), 'ran on gloo', '', nproc=2)

    def cp(**change):
        r = [dict(rank=k, supported=True, device=f'cuda:{k}', errors=[1e-6] * 4) for k in range(2)]
        r[0].update(change)
        return r

    checks._check_context_parallel(cp(), '', nproc=2)
    _fails(
        checks._check_context_parallel,
        cp(supported=False, message='no rule for aten._scaled_dot_product_flash_attention'),
        'not supported',
        '',
        nproc=2,
    )
    _fails(checks._check_context_parallel, cp(errors=[1e-6, 1e-6, 0.3, 1e-6]), 'full attention', '', nproc=2)
    _fails(checks._check_flight_recorder, [], 'stuck', 'rank 0: all_reduce completed')
    checks._check_pytest_ran([], '3 passed in 4.1s')
    _fails(checks._check_pytest_ran, [], 'no test ran', '5 skipped in 0.1s')
    P = 24960
    zero = {
        k: dict(
            num_params=P,
            sent={'DDP': P * 4, 'ZeRO-1': P * 4, 'ZeRO-2': P * 4, 'ZeRO-3': P * 6},
            peak={'DDP': 400, 'ZeRO-1': 300, 'ZeRO-2': 200, 'ZeRO-3': 100},
        )
        for k in range(2)
    }
    script_checks._check_measure_zero(zero, [])
    zero[1]['sent']['ZeRO-3'] = P * 4  # a layer not gathered again for backward
    _fails(script_checks._check_measure_zero, zero, 'ZeRO-3 sent', [])
    zero[1]['sent']['ZeRO-3'] = P * 6
    zero[0]['peak']['ZeRO-2'] = 300  # full gradients kept: ZeRO-1's peak
    _fails(script_checks._check_measure_zero, zero, 'do not fall', [])
    timelines = {'False': [], 'True': []}
    script_checks._check_fsdp_save({0: dict(prefetch=timelines)}, ['prefetch', 'save'])
    script_checks._check_fsdp_save({0: {}}, ['save'])
    _fails(script_checks._check_fsdp_save, {0: {}}, 'no prefetch', ['prefetch', 'save'])
    _fails(script_checks._check_fsdp_save, {}, 'no rank', ['save'])
