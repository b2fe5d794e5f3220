"""make gpucheck's runner: rows chosen by name, GPU rows skipped here, failures and timeouts."""
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpucheck  # noqa: E402

from d2lpar.processes import launched_processes  # noqa: E402


def test_on_a_machine_without_gpus_the_gpu_rows_are_skipped_and_the_table_printed(tmp_path):
    done = subprocess.run([sys.executable, gpucheck.__file__, '--rows', 'nccl,mask',
                           '--logs', str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith('torch ') and 'CUDA' in line for line in lines)  # GPU facts
    chosen = [row for row in gpucheck.rows(tmp_path) if 'nccl' in row.name or 'mask' in row.name]
    skipped = [line for line in lines if 'SKIPPED (needs 2 GPUs)' in line]
    assert len(skipped) == sum(row.needs == 2 for row in chosen) > 10
    assert any('nccl restart' in line for line in skipped)
    assert any('tp_block.py' in line for line in skipped)
    assert [line for line in lines if 'SKIPPED (needs 8 GPUs)' in line][0].startswith(
        'nccl 13_pipeline_parallel parallel_3d.py')
    assert lines[-1] == f'0 passed, 0 failed, {len(chosen)} skipped'


def test_rows_that_pass_fail_or_hang_give_the_right_table_and_exit_status(tmp_path, monkeypatch,
                                                                          capsys):
    marker = tmp_path / 'child.pid'
    hang = ('import subprocess, sys, time; child = subprocess.Popen(["sleep", "300"]); '
            f'open({str(marker)!r}, "w").write(str(child.pid)); time.sleep(300)')
    fake = [gpucheck.Row('passes', argv=[sys.executable, '-c', 'print("fine")']),
            gpucheck.Row('fails', argv=[sys.executable, '-c', 'raise SystemExit("broken")']),
            gpucheck.Row('hangs', argv=[sys.executable, '-c', hang], timeout=3),
            gpucheck.Row('needs eight', needs=8, argv=[sys.executable, '-c', 'pass'])]
    monkeypatch.setattr(gpucheck, 'rows', lambda scratch: fake)
    start = time.monotonic()
    assert gpucheck.main(['--logs', str(tmp_path / 'logs')]) == 1
    out = capsys.readouterr().out.splitlines()
    assert time.monotonic() - start < 60
    table = {line.split()[0]: line for line in out if line.split() and line.split()[0] in
             ('passes', 'fails', 'hangs', 'needs')}
    assert table['passes'].endswith('PASS')
    assert 'FAIL (exit 1: broken' in table['fails']
    assert 'FAIL (timed out after 3 s' in table['hangs']
    assert table['needs'].endswith('SKIPPED (needs 8 GPUs)')
    assert out[-1] == '1 passed, 2 failed, 1 skipped'
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
    args = argv[argv.index('--') + 1:]
    gpucheck._check_pp_schedules(results, args)  # what the row checked passes...
    # ...and each classic bug fails it: a schedule that keeps every micro-batch in flight, one
    # schedule's wrong gradient, every schedule's gradients summed over the micro-batches
    # instead of averaged, activations left held after the step.
    broken = copy.deepcopy(results)
    broken[1]['1F1B']['peak_in_flight'] = broken[1]['GPipe']['peak_in_flight']
    with pytest.raises(gpucheck.CheckFailed, match='1F1B holds'):
        gpucheck._check_pp_schedules(broken, args)
    broken = copy.deepcopy(results)
    stage = next(iter(broken[0]['ZBVZeroBubble']['grads']))
    broken[0]['ZBVZeroBubble']['grads'][stage][0] = [
        [4 * x for x in row] for row in broken[0]['ZBVZeroBubble']['grads'][stage][0]]
    with pytest.raises(gpucheck.CheckFailed, match="ZBVZeroBubble: gradients differ"):
        gpucheck._check_pp_schedules(broken, args)
    broken = copy.deepcopy(results)  # every schedule alike: summed over the micro-batches
    m = int(args[args.index('--microbatches') + 1])
    for r in broken.values():
        for name, schedule in r.items():
            if isinstance(schedule, dict):
                schedule['grads'] = {i: _scaled(ts, m) for i, ts in schedule['grads'].items()}
    with pytest.raises(gpucheck.CheckFailed, match="GPipe: gradients differ from one process"):
        gpucheck._check_pp_schedules(broken, args)
    broken = copy.deepcopy(results)
    broken[0]['GPipe']['alive_after'] = 1
    with pytest.raises(gpucheck.CheckFailed, match='activations still held'):
        gpucheck._check_pp_schedules(broken, args)
    assert launched_processes() == []


def test_the_other_script_checks_catch_their_classic_bugs():
    good_tp = {'out': 1e-7, 'x_grad': 1e-7, 'grads': 1e-7}
    tp_block = {0: {'megatron': dict(good_tp, calls={'all_reduce': [4, 1024]}),
                    'sp': dict(good_tp, partial=0.5), 'overlap_equal': True}}
    gpucheck._check_tp_block(tp_block, [])
    for edit, message in [(lambda r: r['megatron'].update(grads=0.3), 'megatron differs'),
                          (lambda r: r['sp'].update(partial=0.0), 'before the sum'),
                          (lambda r: r['megatron'].update(calls={'all_reduce': [3, 768]}),
                           'collectives'),
                          (lambda r: r.update(overlap_equal=False), 'changed the gradients')]:
        broken = copy.deepcopy(tp_block)
        edit(broken[0])
        with pytest.raises(gpucheck.CheckFailed, match=message):
            gpucheck._check_tp_block(broken, [])
    coords = [(a, b, c) for a in range(2) for b in range(2) for c in range(2)]
    rows = [[0, 8], [16, 24], [8, 16], [24, 32]] + [[0, 8]] * 4
    three_d = {rank: dict(pp=a, dp=b, tp=c, max_diff=1e-8, moved=0.05, steps=2, mlp0_rows=rows[rank],
                          sizes=dict(B=8, T=4, H=32, LR=0.1))
               for rank, (a, b, c) in enumerate(coords)}
    gpucheck._check_parallel_3d(three_d, [])  # tolerance 0.1 * 2 * 8 * 4 * 32 * 2**-23 = 6.1e-6
    three_d[5]['max_diff'] = 1e-3  # a gradient not averaged over the data-parallel halves
    with pytest.raises(gpucheck.CheckFailed, match='rank 5: off by'):
        gpucheck._check_parallel_3d(three_d, [])


def test_a_script_the_notebook_does_not_write_is_named_before_any_kernel_starts(tmp_path):
    done = subprocess.run([sys.executable, gpucheck.__file__, 'script',
                           'notebooks/13_pipeline_parallel.ipynb', 'no_such.py', '--scratch',
                           str(tmp_path / 's')], cwd=gpucheck.ROOT, capture_output=True,
                          text=True, timeout=60)
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
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import tempfile\nfrom pathlib import Path\n"
                                  "work = Path(tempfile.mkdtemp(prefix='d2lpar-99-'))"),
        nbformat.v4.new_code_cell('%%writefile {work}/sleeper.py\nimport os, pathlib, time\n'
                                  "(pathlib.Path(os.environ['MARKS']) / f'rank-{os.getpid()}')"
                                  '.touch()\ntime.sleep(300)\n')])
    notebook = tmp_path / '99_sleeper.ipynb'
    nbformat.write(nb, notebook)
    proc = subprocess.Popen([sys.executable, gpucheck.__file__, 'script', str(notebook),
                             'sleeper.py', '--nproc', '1', '--backend', 'gloo', '--device', 'cpu',
                             '--scratch', str(tmp_path / 's')], start_new_session=True,
                            env=dict(os.environ, MARKS=str(marks)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    assert not [pid for pid in pids if Path(f'/proc/{pid}').exists()
                and 'Z' not in Path(f'/proc/{pid}/stat').read_text().split()[2]]
