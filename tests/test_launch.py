"""d2lpar.launch: torchrun from Python, with output per rank, results, failures named, and nothing
left behind (how it ends every process when a launch fails or is stopped: test_launch_cleanup.py).

Each test that starts processes checks afterwards that none of them survives and that
the port is free again, whether the ranks succeeded, crashed, hung or were interrupted.
"""

import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import pytest

from d2lpar import LaunchResult, launch, port_is_free

from launching import PROBE, ROOT, nothing_left_behind, posix_only  # noqa: F401  (an autouse fixture)


@posix_only
def test_ranks_report_output_and_results():
    result = launch(PROBE, nproc=2, args=['--mode', 'ok'], timeout=120, echo=False)
    assert isinstance(result, LaunchResult) and result.ok and result.returncode == 0
    assert sorted(result.by_rank()) == [0, 1]
    assert result.by_rank('world_size') == {0: 2, 1: 2}
    assert result.by_rank('local_rank_env') == {0: '0', 1: '1'}
    assert result.by_rank('argv') == {0: ['--mode', 'ok'], 1: ['--mode', 'ok']}
    pids = result.by_rank('pid')
    assert result.output[0][0].startswith(f'hello from rank 0 pid {pids[0]} ')
    assert result.output[1][0].startswith(f'hello from rank 1 pid {pids[1]} ')
    assert port_is_free(result.port)
    suffix = result.launch_id.split('-')[1]
    assert not (Path(tempfile.gettempdir()) / f'd2lpar-launch-{suffix}').exists()
    assert f'[rank 1] {result.output[1][0]}' in result.text().splitlines()
    assert result.check() is result


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='reads /proc/PID/cmdline')
def test_the_printed_command_and_environment_are_what_ran():
    result = launch(PROBE, nproc=2, args=['--mode', 'ok'], timeout=120, echo=False, env={'D2LPAR_TEST_ADDED': 'yes'})
    assert result.ok, result.text()
    assert len(result.commands) == 1
    argv = shlex.split(result.commands[0])
    # the agent wrapper, which then becomes torchrun: torchrun's command line is the rest
    assert argv[:3] == [sys.executable, str(ROOT / 'd2lpar/machinery/programs/start_agent.py'), str(os.getpid())]
    torchrun_argv = argv[3:]
    assert torchrun_argv[:3] == [sys.executable, '-m', 'torch.distributed.run']
    for rank, seen in result.by_rank('cmdlines').items():
        assert seen['parent'] == torchrun_argv  # exactly what torchrun ran as
        # each rank: python -u, the shim under the script's name, the script, its args
        assert seen['rank'][-4:] == torchrun_argv[-4:] == [torchrun_argv[-4], str(PROBE), '--mode', 'ok']
        assert Path(seen['rank'][-4]).name == PROBE.name != seen['rank'][-4]
    # every variable the launch changed is named in result.env, with the value the ranks saw
    assert result.env['D2LPAR_TEST_ADDED'] == 'yes' and result.env['OMP_NUM_THREADS'] == '1'
    assert result.env['MASTER_PORT'] == str(result.port)
    assert result.env['TORCHELASTIC_USE_AGENT_STORE'] == 'True'
    for rank, environ in result.by_rank('environ').items():
        assert {k: environ.get(k) for k in result.env} == result.env
        # and nothing else the ranks saw differs from the kernel's, but what torchrun sets
        others = {k for k in environ if environ[k] != os.environ.get(k)} - set(result.env)
        assert all(k in TORCHRUN_SETS or k.startswith(('TORCHELASTIC_', 'TORCH_NCCL_')) for k in others), others


# what torchrun itself puts in every worker's environment (torch/distributed/elastic/agent)
TORCHRUN_SETS = {
    'LOCAL_RANK',
    'RANK',
    'GROUP_RANK',
    'ROLE_RANK',
    'ROLE_NAME',
    'LOCAL_WORLD_SIZE',
    'WORLD_SIZE',
    'GROUP_WORLD_SIZE',
    'ROLE_WORLD_SIZE',
    'MASTER_ADDR',
    'MASTER_PORT',
    'TORCH_NCCL_ASYNC_ERROR_HANDLING',
    'NCCL_ASYNC_ERROR_HANDLING',
    'OMP_NUM_THREADS',
    'PYTHONUNBUFFERED',
    'CUDA_MODULE_LOADING',
    'TORCHELASTIC_RUN_ID',
}


@posix_only
def test_echo_prints_each_line_prefixed_by_its_rank(capsys):
    launch(PROBE, nproc=2, args=['--mode', 'quick'], timeout=120, launcher='torch.distributed.launch')
    lines = capsys.readouterr().out.splitlines()
    for rank in (0, 1):  # the deprecated launcher passes --local-rank to the script
        assert any(
            line.startswith(f'[rank {rank}] hello from rank {rank} pid ')
            and line.endswith(f"argv ['--local-rank={rank}', '--mode', 'quick']")
            for line in lines
        ), lines
    # torch warns that the launcher is deprecated; its category, not its wording, is checked
    assert any('FutureWarning' in line for line in lines)


@pytest.mark.parametrize(
    'kwargs,error,message',
    [
        (dict(script='no_such_script.py'), ValueError, 'no script'),
        (dict(script=42), TypeError, 'path'),
        (dict(nproc=0), ValueError, 'nproc'),
        (dict(nproc=True), ValueError, 'nproc'),
        (dict(nproc=2.0), ValueError, 'nproc'),
        (dict(nnodes=0), ValueError, 'nnodes'),
        (dict(args='--mode ok'), TypeError, r"args=\['--mode', 'ok'\]"),
        (dict(args=[None]), TypeError, 'string or number'),
        (dict(timeout=0), ValueError, 'timeout'),
        (dict(timeout='60'), ValueError, 'timeout'),
        (dict(grace=-1), ValueError, 'grace'),
        (dict(timeout=float('inf')), ValueError, 'timeout must be finite'),
        (dict(timeout=float('nan')), ValueError, 'timeout must be a positive'),
        (dict(env=['A=1']), TypeError, 'dict'),
        (dict(env={'A=B': '1'}), ValueError, 'name'),
        (dict(env={'A': object()}), TypeError, 'None'),
        (dict(launcher='mpirun'), ValueError, 'launcher'),
        (dict(launcher='python', nproc=2), ValueError, 'nproc=1'),
        (dict(port=70000), ValueError, 'port'),
        (dict(max_restarts=-1), ValueError, 'max_restarts'),
        (dict(max_restarts=True), ValueError, 'max_restarts'),
        (dict(launcher='python', nproc=1, max_restarts=1), ValueError, 'needs torchrun'),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(kwargs, error, message):
    before = set(os.listdir(tempfile.gettempdir()))
    call = dict(script=PROBE, nproc=2, args=['--mode', 'ok'], timeout=60)
    call.update(kwargs)
    with pytest.raises(error, match=message):
        launch(call.pop('script'), **call)
    created = {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith('d2lpar-launch-')}
    assert not created


@posix_only
def test_max_restarts_lets_torchrun_restart_the_whole_group():
    result = launch(PROBE, nproc=2, args=['--mode', 'restart'], timeout=120, echo=False, max_restarts=1)
    assert result.ok, result.text()
    assert result.by_rank('attempt') == {0: 1, 1: 1}  # both ranks ran again, on attempt 1
    for rank in (0, 1):
        assert result.output[rank].count('attempt 0') == 1, result.output[rank]
        assert result.output[rank].count('attempt 1') == 1, result.output[rank]
    assert any('--max-restarts=1' in command for command in result.commands)
    assert port_is_free(result.port)
    without = launch(PROBE, nproc=2, args=['--mode', 'restart'], timeout=120, echo=False)
    assert without.returncode != 0 and not without.results  # no restart: the failure stands


@posix_only
def test_a_crashing_rank_stops_the_launch():
    start = time.monotonic()
    result = launch(PROBE, nproc=2, args=['--mode', 'crash'], timeout=120, echo=False)
    assert result.returncode != 0 and not result.timed_out and not result.ok
    assert time.monotonic() - start < 60  # rank 0 sleeps 300 s: torchrun stopped it
    assert 'rank about to crash' in result.output[1]
    assert any('exitcode' in line for line in result.output['torchrun'])
    assert port_is_free(result.port)
    with pytest.raises(RuntimeError, match='exited with status'):
        result.check()


@posix_only
@pytest.mark.parametrize('crash_rank', [0, 1])
def test_a_stopped_rank_keeps_its_output_and_the_first_failure_is_named(crash_rank):
    other = 1 - crash_rank
    result = launch(PROBE, nproc=2, args=['--mode', 'crash', '--crash-rank', crash_rank], timeout=120, echo=False)
    assert result.first_failure == crash_rank
    assert result.exits[crash_rank]['how'] == 'error' and result.exits[crash_rank]['code'] == 3
    # torchrun stopped the other rank; what it printed before is kept, and it says why it ended
    assert result.exits[other]['how'] == 'stopped'
    assert result.output[other][0].startswith(f'hello from rank {other} pid ')
    assert result.output[other][1] == 'waiting for the others'
    assert 'stopped by SIGTERM' in result.output[other][-1]
    assert 'rank_shim.py of d2lpar.launch' in result.output[other][-1]  # says who writes it
    with pytest.raises(RuntimeError, match=f'rank {crash_rank} failed first'):
        result.check()


@posix_only
def test_what_c_code_printed_is_kept_even_when_the_rank_is_stopped():
    result = launch(PROBE, nproc=2, args=['--mode', 'cprint'], timeout=120, echo=False)
    assert not result.ok and result.first_failure == 1
    for rank in (0, 1):
        assert f'printed by C in rank {rank}' in result.output[rank]
    assert result.exits[0]['how'] == 'stopped'


def test_the_first_failure_falls_back_to_torchruns_root_cause():
    lines = [
        'Failures:',
        '[1]:',
        '  rank      : 0 (local_rank: 0)',
        'Root Cause (first observed failure):',
        '[0]:',
        '  rank      : 1 (local_rank: 1)',
    ]
    result = LaunchResult(1, {'torchrun': lines}, [])
    assert result.first_failure == 1
    assert LaunchResult(0, {0: ['fine']}, []).first_failure is None
