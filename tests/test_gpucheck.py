"""make gpucheck's runner (verify/gpucheck.py): rows chosen by name, GPU rows skipped here, failures
and timeouts, scripts written as the notebooks write them, and the ranks' numbers handed to each row's
check. The driver preflight: test_gpucheck_preflight.py; the check functions: test_gpucheck_checks.py."""

import copy
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'verify'))
import gpucheck  # noqa: E402
from verify.gpu import checks, script_checks  # noqa: E402  (gpucheck put the repository on sys.path)

from d2lpar.machinery.processes import launched_processes  # noqa: E402


def _no_driver(monkeypatch):
    """This machine as gpucheck sees it when no NVIDIA driver is installed."""
    monkeypatch.setattr(
        gpucheck,
        'driver_gpus',
        lambda: dict(count=0, version=None, cuda=None, exclusive=False, summary='no NVIDIA GPU'),
    )


@pytest.mark.skipif(__import__('d2lpar').num_gpus() > 0, reason='with GPUs the rows would run')
def test_on_a_machine_without_gpus_the_gpu_rows_are_skipped_and_the_table_printed(tmp_path):
    done = subprocess.run(
        [sys.executable, gpucheck.__file__, '--rows', 'nccl,mask', '--allow-cpu', '--logs', str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith('torch ') and 'CUDA' in line for line in lines)  # GPU facts
    chosen = [row for row in gpucheck.rows(tmp_path) if not row.quick and ('nccl' in row.name or 'mask' in row.name)]
    # Each verdict printed as the row finished ([k/N] ...), then the table.
    progress = [line for line in lines if line.startswith('[')]
    assert len(progress) == len(chosen) and all('SKIPPED' in line for line in progress)
    skipped = [line for line in lines if 'SKIPPED (needs 2 GPUs)' in line and line[0] != '[']
    assert len(skipped) == sum(row.needs == 2 for row in chosen) > 10
    assert any('nccl restart' in line for line in skipped)
    assert any('tp_sp.py' in line for line in skipped)
    assert [line for line in lines if 'SKIPPED (needs 8 GPUs)' in line][-1].startswith(
        'nccl 14_pipeline_parallel parallel_3d.py'
    )
    assert lines[-1].startswith(f'0 passed, 0 failed, {len(chosen)} skipped or not run')
    assert len((tmp_path / 'summary.tsv').read_text().splitlines()) == len(chosen) + 1


def test_rows_that_pass_fail_or_hang_give_the_right_table_and_exit_status(tmp_path, monkeypatch, capsys):
    marker = tmp_path / 'child.pid'
    hang = (
        'import subprocess, sys, time; child = subprocess.Popen(["sleep", "300"]); '
        f'open({str(marker)!r}, "w").write(str(child.pid)); time.sleep(300)'
    )
    fake = [
        gpucheck.Row('passes', argv=[sys.executable, '-c', 'print("fine")']),
        gpucheck.Row('fails', argv=[sys.executable, '-c', 'raise SystemExit("broken")']),
        gpucheck.Row('hangs', argv=[sys.executable, '-c', hang], timeout=3),
        gpucheck.Row('needs eight', needs=8, argv=[sys.executable, '-c', 'pass']),
    ]
    monkeypatch.setattr(gpucheck, 'rows', lambda scratch: fake)
    _no_driver(monkeypatch)
    start = time.monotonic()
    assert gpucheck.main(['--allow-cpu', '--logs', str(tmp_path / 'logs')]) == 1
    out = capsys.readouterr().out.splitlines()
    assert time.monotonic() - start < 60
    table = {
        line.split()[0]: line
        for line in out
        if line.split() and line.split()[0] in ('passes', 'fails', 'hangs', 'needs')
    }
    assert table['passes'].endswith('PASS')
    assert 'FAIL (exit 1: broken' in table['fails']
    assert 'FAIL (timed out after 3 s' in table['hangs']
    assert table['needs'].endswith('SKIPPED (needs 8 GPUs)')
    assert out[-1].startswith('1 passed, 2 failed, 1 skipped or not run')
    # The hung row's whole process tree is gone, not only its first process.
    pid = int(marker.read_text())
    assert not Path(f'/proc/{pid}').exists() or 'Z' in Path(f'/proc/{pid}/stat').read_text().split()[2]
    assert (tmp_path / 'logs' / 'passes.log').read_text().strip() == 'fine'
    assert launched_processes() == []


def test_a_row_selection_that_matches_nothing_says_so():
    with pytest.raises(SystemExit):
        gpucheck.main(['--rows', 'no such row'])


def _scaled(value, factor):
    return [_scaled(v, factor) for v in value] if isinstance(value, list) else factor * value


def test_a_notebook_script_row_writes_the_script_as_the_notebook_does_and_checks_its_ranks(tmp_path):
    """The pipeline-schedules row itself, run on CPU with gloo instead of NCCL on GPUs.

    Everything but the GPU-only path runs for real here: the notebook's setup, #@save and
    %%writefile cells in a kernel (work folder under the row's TMPDIR), torchrun on 2 ranks
    with the notebook's full-size arguments, the check of what the ranks handed back. The
    GPU-only path (each rank's torch.cuda.set_device, init_process_group(device_id=...),
    init_device_mesh('cuda'), PipelineStage on cuda:LOCAL_RANK) needs 2 GPUs: `make gpucheck
    GPUCHECK_FLAGS=--rows=pp_schedules` runs it.
    """
    [row] = [r for r in gpucheck.rows(tmp_path / 'unused') if 'pp_schedules.py' in r.name]
    assert row.needs == 2 and row.argv[row.argv.index('--backend') + 1] == 'nccl'
    argv = list(map(str, row.argv))
    argv[argv.index('--backend') + 1], argv[argv.index('--device') + 1] = 'gloo', 'cpu'
    argv[argv.index('--scratch') + 1] = str(tmp_path / 'row')
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert 'pp_schedules.py on 2 processes (gloo, cpu): checked: every schedule' in done.stdout
    # The notebook's own work folder, in the row's TMPDIR, holding the script and its module.
    [work] = (tmp_path / 'row' / 'tmp').glob('d2lpar-13-*')
    assert sorted(p.name for p in work.glob('*.py')) == ['pp_schedules.py', 'pp_steps.py']
    assert 'def split_backward' in (work / 'pp_steps.py').read_text()
    assert "--backend', choices=['gloo', 'nccl']" in (work / 'pp_schedules.py').read_text()
    results = {}
    for f in (tmp_path / 'row' / 'results').glob('*.json'):
        record = json.loads(f.read_text())
        results[record['rank']] = record
    args = argv[argv.index('--') + 1 :]
    script_checks._check_pp_schedules(results, args)  # what the row checked passes...
    # ...and each classic bug fails it: a schedule that keeps every micro-batch in flight, one
    # schedule's wrong gradient, every schedule's gradients summed over the micro-batches
    # instead of averaged, activations left held after the step.
    broken = copy.deepcopy(results)
    broken[1]['1F1B']['peak_in_flight'] = broken[1]['GPipe']['peak_in_flight']
    with pytest.raises(checks.CheckFailed, match='1F1B holds'):
        script_checks._check_pp_schedules(broken, args)
    broken = copy.deepcopy(results)
    stage = next(iter(broken[0]['ZBVZeroBubble']['grads']))
    broken[0]['ZBVZeroBubble']['grads'][stage][0] = [
        [4 * x for x in row] for row in broken[0]['ZBVZeroBubble']['grads'][stage][0]
    ]
    with pytest.raises(checks.CheckFailed, match="ZBVZeroBubble: gradients differ"):
        script_checks._check_pp_schedules(broken, args)
    broken = copy.deepcopy(results)  # every schedule alike: summed over the micro-batches
    m = int(args[args.index('--microbatches') + 1])
    for r in broken.values():
        for name, schedule in r.items():
            if isinstance(schedule, dict):
                schedule['grads'] = {i: _scaled(ts, m) for i, ts in schedule['grads'].items()}
    with pytest.raises(checks.CheckFailed, match="GPipe: gradients differ from one process"):
        script_checks._check_pp_schedules(broken, args)
    broken = copy.deepcopy(results)
    broken[0]['GPipe']['alive_after'] = 1
    with pytest.raises(checks.CheckFailed, match='activations still held'):
        script_checks._check_pp_schedules(broken, args)
    assert launched_processes() == []


def test_the_other_script_checks_catch_their_classic_bugs():
    good_tp = {'out': 1e-7, 'x_grad': 1e-7, 'grads': 1e-7}
    tp_block = {
        r: {
            'megatron': dict(good_tp, calls={'all_reduce': [4, 1024]}),
            'sp': dict(good_tp, partial=0.5),
            'overlap_equal': True,
        }
        for r in (0, 1)
    }
    script_checks._check_tp_block(tp_block, [])
    for edit, message in [
        (lambda r: r['megatron'].update(grads=0.3), 'megatron differs'),
        (lambda r: r['sp'].update(partial=0.0), 'before the sum'),
        (lambda r: r['megatron'].update(calls={'all_reduce': [3, 768]}), 'collectives'),
        (lambda r: r.update(overlap_equal=False), 'changed the gradients'),
    ]:
        broken = copy.deepcopy(tp_block)
        edit(broken[0])
        with pytest.raises(checks.CheckFailed, match=message):
            script_checks._check_tp_block(broken, [])
    from d2lpar.tensor_parallel import block_bytes

    want = block_bytes(1000, 32, 8, 2, replicated=40)
    costs = {
        rank: dict(
            params=1000,
            B=4,
            T=8,
            D=8,
            replicated=40,
            peak=1e9,
            bytes={name: {'x': [1, round(b)]} for name, b in want.items()},
            seconds={name: 0.01 for name in want},
        )
        for rank in (0, 1)
    }
    script_checks._check_tp_costs(costs, [])
    for rank in costs:  # a missing all-reduce
        costs[rank]['bytes']['TP'] = {'all_reduce': [3, round(want['TP'] * 3 / 4)]}
    with pytest.raises(checks.CheckFailed, match='TP: ranks sent'):
        script_checks._check_tp_costs(costs, [])
    for rank in costs:
        costs[rank]['bytes']['TP'] = {'all_reduce': [4, round(want['TP'])]}
    costs[0]['seconds']['DP'] = 1e-6  # faster than the peak allows
    with pytest.raises(checks.CheckFailed, match='DP: MFU'):
        script_checks._check_tp_costs(costs, [])
    coords = [(a, b, c) for a in range(2) for b in range(2) for c in range(2)]
    rows = [[0, 8], [16, 24], [8, 16], [24, 32]] + [[0, 8]] * 4
    three_d = {
        rank: dict(
            pp=a,
            dp=b,
            tp=c,
            max_diff=1e-8,
            moved=0.05,
            steps=2,
            mlp0_rows=rows[rank],
            sizes=dict(B=8, T=4, H=32, LR=0.1),
        )
        for rank, (a, b, c) in enumerate(coords)
    }
    script_checks._check_parallel_3d(three_d, [])  # tolerance 0.1 * 2 * 8 * 4 * 32 * 2**-23 = 6.1e-6
    three_d[5]['max_diff'] = 1e-3  # a gradient not averaged over the data-parallel halves
    with pytest.raises(checks.CheckFailed, match='rank 5: off by'):
        script_checks._check_parallel_3d(three_d, [])


def test_a_script_the_notebook_does_not_write_is_named_before_any_kernel_starts(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            gpucheck.__file__,
            'script',
            'notebooks/14_pipeline_parallel.ipynb',
            'no_such.py',
            '--backend',
            'gloo',
            '--device',
            'cpu',
            '--scratch',
            str(tmp_path / 's'),
        ],
        cwd=gpucheck.ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode != 0
    assert "no cell starting with '%%writefile {work}/no_such.py'" in done.stderr


def test_a_script_row_ended_midway_leaves_no_rank_behind(tmp_path):
    """gpucheck ends a row with SIGTERM to its process group; torchrun must get to end its ranks.

    (Seen failing: with subprocess.run, the runner's exit SIGKILLed torchrun, and the rank,
    in a session of its own, kept running.)
    """
    import nbformat

    marks = tmp_path / 'marks'
    marks.mkdir()
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "import tempfile\nfrom pathlib import Path\nwork = Path(tempfile.mkdtemp(prefix='d2lpar-99-'))"
            ),
            nbformat.v4.new_code_cell(
                '%%writefile {work}/sleeper.py\nimport os, pathlib, time\n'
                "(pathlib.Path(os.environ['MARKS']) / f'rank-{os.getpid()}')"
                '.touch()\ntime.sleep(300)\n'
            ),
        ]
    )
    notebook = tmp_path / '99_sleeper.ipynb'
    nbformat.write(nb, notebook)
    proc = subprocess.Popen(
        [
            sys.executable,
            gpucheck.__file__,
            'script',
            str(notebook),
            'sleeper.py',
            '--nproc',
            '1',
            '--backend',
            'gloo',
            '--device',
            'cpu',
            '--scratch',
            str(tmp_path / 's'),
        ],
        start_new_session=True,
        env=dict(os.environ, MARKS=str(marks)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not list(marks.glob('rank-*')) and time.monotonic() < deadline:
        assert proc.poll() is None, 'the row ended before its rank started'
        time.sleep(0.2)
    pids = [int(p.name.split('-')[1]) for p in marks.iterdir()]
    assert len(pids) == 1
    gpucheck._end(proc)  # what a row's timeout or Ctrl-C does
    deadline = time.monotonic() + 15
    while any(Path(f'/proc/{pid}').exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [
        pid
        for pid in pids
        if Path(f'/proc/{pid}').exists() and 'Z' not in Path(f'/proc/{pid}/stat').read_text().split()[2]
    ]


# --- Rows that check numbers: the runner hands the ranks' results to the row's check ---


def test_a_row_that_exits_0_with_wrong_numbers_fails(tmp_path, monkeypatch, capsys):
    emit = 'from d2lpar.distributed import emit_result; emit_result(rank=0, total={})'
    fake = [
        gpucheck.Row(
            'right',
            argv=[sys.executable, '-c', emit.format(1.0)],
            check=functools.partial(checks._check_hello, nproc=1),
            env={'NCCL_DEBUG': 'INFO'},
        ),
        gpucheck.Row(
            'wrong',
            argv=[sys.executable, '-c', emit.format(2.0)],
            check=functools.partial(checks._check_hello, nproc=1),
        ),
        gpucheck.Row(
            'silent', argv=[sys.executable, '-c', 'pass'], check=functools.partial(checks._check_hello, nproc=1)
        ),
    ]
    fake[0].argv[-1] += '; print("host:1:1 [0] NCCL INFO Bootstrap")'
    monkeypatch.setattr(gpucheck, 'rows', lambda scratch: fake)
    _no_driver(monkeypatch)
    assert gpucheck.main(['--allow-cpu', '--logs', str(tmp_path)]) == 1
    out = capsys.readouterr().out
    table = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.split() and line.split()[0] in ('right', 'wrong', 'silent')
    }
    assert table['right'].endswith('PASS')
    assert 'check failed: rank 0: all_reduce gave 2.0, not 1' in table['wrong']
    assert "check failed: 'total' from ranks [], expected 0-0" in table['silent']


def test_the_runner_sets_offline_data_and_a_free_port(tmp_path, monkeypatch, capsys):
    show = (
        'import os, sys; print("offline", os.environ.get("D2LPAR_OFFLINE"), '
        '"small", os.environ.get("D2LPAR_SMALL"), "port", sys.argv[1])'
    )
    monkeypatch.setenv('D2LPAR_SMALL', '1')  # the test suite's: not a full-size row's
    fake = [gpucheck.Row('env', argv=[sys.executable, '-c', show, f'{gpucheck.PORT}'])]
    monkeypatch.setattr(gpucheck, 'rows', lambda scratch: fake)
    _no_driver(monkeypatch)
    assert gpucheck.main(['--allow-cpu', '--logs', str(tmp_path)]) == 0
    words = (tmp_path / 'env.log').read_text().split()
    assert words[:4] == ['offline', '1', 'small', 'None']
    assert words[5].isdigit() and int(words[5]) != 29500


def test_every_gpu_row_checks_numbers_and_the_quick_rows_fit_one_gpu_in_8_minutes(tmp_path):
    table = gpucheck.rows(tmp_path)
    for row in table:
        if row.notebook is not None:
            continue  # the notebook's own asserts
        script = row.argv[row.argv.index('script') + 2] if 'script' in row.argv else None
        assert row.check is not None or script in script_checks.CHECKS, row.name
    quick = [row for row in table if row.quick]
    assert all(row.needs == 1 and row.name.startswith('quick: ') for row in quick)
    assert sum(row.estimate for row in quick) < 8 * 60  # estimates, stated as such
    covered = ' '.join(row.name for row in quick)
    for part in (
        'ddp',
        'SyncBatchNorm',
        'inductor',
        'profiler',
        'mini-DDP',
        'context_parallel',
        'measure_zero',
        'fsdp_save',
        'tp_sp',
        'tp_loss',
        '01_single_device',
        '08_lenet',
    ):
        assert part in covered, part
    assert 'nccl' in ' '.join(str(a) for row in quick for a in row.argv)
