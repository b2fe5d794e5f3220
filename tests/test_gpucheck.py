"""make gpucheck's runner: rows chosen by name, GPU rows skipped here, failures and timeouts."""
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
    skipped = [line for line in lines if 'SKIPPED (needs 2 GPUs)' in line]
    assert len(skipped) == 10 and any('nccl restart' in line for line in skipped)
    assert lines[-1] == '0 passed, 0 failed, 10 skipped'


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
