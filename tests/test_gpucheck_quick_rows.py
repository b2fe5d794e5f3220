"""The quick check's script rows (`verify/gpucheck.py --quick`, one GPU), run here on the CPU.

Each of these rows writes a notebook's script as the notebook does and launches it under
torchrun on ONE rank. On the first real GPU run (an H200, torch 2.11) all four failed for
reasons that have nothing to do with the GPU: checks written for two or more ranks, and
scripts written from their first `%%writefile` cell only (not the `-a` parts). Running
each row with gloo on the CPU, at the row's own rank count and arguments, catches that kind of
failure before a GPU is at hand; only the NCCL and CUDA calls themselves stay for the GPU.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'verify'))
import gpucheck  # noqa: E402
from verify.gpu import checks, script_checks  # noqa: E402  (gpucheck put the repository on sys.path)

QUICK_SCRIPT_ROWS = [r for r in gpucheck.rows(Path('unused')) if r.quick and 'script' in map(str, r.argv)]


def test_the_quick_check_has_script_rows_on_one_rank():
    assert len(QUICK_SCRIPT_ROWS) >= 4
    assert {r.needs for r in QUICK_SCRIPT_ROWS} == {1}


@pytest.mark.parametrize('row', QUICK_SCRIPT_ROWS, ids=lambda r: Path(str(r.argv[r.argv.index('script') + 2])).stem)
def test_a_quick_script_row_passes_on_the_cpu_at_its_own_rank_count(row, tmp_path):
    argv = list(map(str, row.argv))
    argv[argv.index('--backend') + 1], argv[argv.index('--device') + 1] = 'gloo', 'cpu'
    argv[argv.index('--scratch') + 1] = str(tmp_path / 'row')
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    script = argv[argv.index('script') + 2]
    assert f'{script} on 1 processes (gloo, cpu): checked: ' in done.stdout, done.stdout[-2000:]
    assert 'destroy_process_group() was not called' not in done.stderr  # a script that stopped short
    results = [json.loads(f.read_text()) for f in (tmp_path / 'row' / 'results').glob('*.json')]
    assert [r['rank'] for r in results] == [0]


def test_one_rank_shards_nothing_so_measure_zero_does_not_ask_its_peaks_to_fall():
    stages = ['DDP', 'ZeRO-1', 'ZeRO-2', 'ZeRO-3']
    # What the H200 run's one rank handed back: nothing sent, peaks that rise slightly.
    one = dict(num_params=24960, sent=dict.fromkeys(stages, 0))
    script_checks._check_measure_zero({0: dict(one, peak=dict(zip(stages, [6857776, 6857776, 6864948, 7127092])))}, [])
    # On two ranks the same peaks are a bug: ZeRO shards, so they must fall.
    two = dict(num_params=24960, sent=dict(zip(stages, [24960 * 4, 24960 * 4, 24960 * 4, 24960 * 6])))
    with pytest.raises(checks.CheckFailed, match='do not fall'):
        script_checks._check_measure_zero(
            {k: dict(two, peak=dict(zip(stages, [6857776, 6857776, 6864948, 7127092]))) for k in range(2)}, []
        )


@pytest.mark.parametrize('version', ['2.11.0+cu130', None])
def test_gpucheck_says_so_next_to_its_verdicts_when_torch_is_older_than_the_floor(
    version, tmp_path, monkeypatch, capsys
):
    import torch

    if version:  # the first GPU run's torch (the machine's own, nothing newer could reach it)
        monkeypatch.setattr(torch, '__version__', version)
    monkeypatch.setattr(gpucheck, 'rows', lambda scratch: [gpucheck.Row('fine', argv=[sys.executable, '-c', 'pass'])])
    monkeypatch.setattr(
        gpucheck,
        'driver_gpus',
        lambda: dict(count=0, version=None, cuda=None, exclusive=False, summary='no NVIDIA GPU'),
    )
    assert gpucheck.main(['--allow-cpu', '--logs', str(tmp_path)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith('note: torch')]
    assert len(notes) == (1 if version else 0)
    assert all(version in line and 'older than' in line for line in notes)
