"""Notebook 6's SLURM job file, submitted to a real SLURM: every task becomes a DDP rank.

Needs a running SLURM cluster (`bash .ci/slurm-local.sh start` starts a one-node one as
root). Without one the test skips and says why; CI sets D2LPAR_REQUIRE_SLURM=1, which turns
that skip into a failure.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from d2lpar.devices import env_flag
from d2lpar import launch, launched_processes

NOTEBOOKS = Path(__file__).resolve().parent.parent / 'notebooks'
JOB = 'scripts/ddp_multinode.sbatch'


def slurm_problem():
    """Return why no job can run here, or None when a SLURM node is up."""
    if shutil.which('sbatch') is None:
        return 'SLURM is not installed (bash .ci/slurm-local.sh start installs and starts it)'
    states = subprocess.run(['sinfo', '-h', '-o', '%T'], capture_output=True, text=True, timeout=30)
    if states.returncode != 0 or not {'idle', 'mixed', 'allocated'} & set(states.stdout.split()):
        return f'no SLURM node is up (sinfo: {(states.stdout + states.stderr).strip()!r})'
    return None


@pytest.fixture
def slurm():
    problem = slurm_problem()
    if problem:
        if env_flag('D2LPAR_REQUIRE_SLURM'):
            pytest.fail(f'D2LPAR_REQUIRE_SLURM is set but {problem}')
        pytest.skip(problem)


def submit(job, tmp_path, *options, timeout=600):
    """Submit `job` from notebooks/ with `sbatch --wait`; return (exit code, its output)."""
    env = dict(
        os.environ,
        D2LPAR_RESULT_DIR=str(tmp_path),  # ranks write their results here
        PATH=f'{Path(sys.executable).parent}{os.pathsep}{os.environ["PATH"]}',
    )
    command = ['sbatch', '--wait', '--parsable', f'--output={tmp_path}/job-%j.out', *options, job]
    proc = subprocess.Popen(command, cwd=NOTEBOOKS, env=env, stdout=subprocess.PIPE, text=True)
    job_id = proc.stdout.readline().strip().split(';')[0]
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:  # leave no job (and no rank) behind
        subprocess.run(['scancel', job_id], timeout=30)
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
    return proc.returncode, (tmp_path / f'job-{job_id}.out').read_text()


def test_the_job_file_runs_one_ddp_rank_per_slurm_task(slurm, tmp_path):
    # One node with two tasks stands in for the job file's two nodes; the options given on
    # the command line override its #SBATCH lines, as on any cluster.
    code, output = submit(JOB, tmp_path, '--nodes=1', '--ntasks-per-node=2', '--cpus-per-task=1', '--gpus-per-node=0')
    assert code == 0, output
    run = {}
    for path in tmp_path.glob('*.json'):
        record = json.loads(path.read_text())
        run[record['rank']] = record
    assert sorted(run) == [0, 1], output
    assert {r['source'] for r in run.values()} == {'slurm'}  # ranks from SLURM_PROCID...
    assert [run[r]['local_rank'] for r in (0, 1)] == [0, 1]  # ... and SLURM_LOCALID
    assert run[0]['replica_gap'] == run[1]['replica_gap'] == 0
    assert run[0]['final'] == run[1]['final']
    # The same training as one process on the same global batches (the job file's arguments).
    single = (
        launch(
            NOTEBOOKS / 'scripts' / 'train_single.py',
            nproc=1,
            launcher='python',
            args=['--epochs', '4', '--batch-size', '32'],
            timeout=300,
            echo=False,
        )
        .check()
        .by_rank()[0]
    )
    torch.testing.assert_close(torch.tensor(run[0]['final']), torch.tensor(single['final']), rtol=1e-4, atol=1e-5)
    assert launched_processes() == []
