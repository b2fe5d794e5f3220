"""d2lpar.launch: torchrun from Python, with output per rank, results, and nothing left behind.

Each test that starts processes checks afterwards that none of them survives and that
the port is free again, whether the ranks succeeded, crashed, hung or were interrupted.
"""

import _thread
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from d2lpar.launch import LaunchResult, end_processes, launch, launched_processes, port_is_free

HERE = Path(__file__).resolve().parent
PROBE = HERE / 'scripts' / 'launch_probe.py'
ROOT = HERE.parent
posix_only = pytest.mark.skipif(os.name != 'posix', reason='the launcher needs Linux or macOS')


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert launched_processes() == [], 'a launch left processes running'


def wait_for(predicate, seconds=60):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f'gave up after {seconds} s')


def workers_of(prefix, count):
    """Wait until `count` processes of launches whose id starts with `prefix` run."""

    def enough():
        procs = launched_processes(prefix)
        return procs if len(procs) >= count else None

    return wait_for(enough)


def rank_of(pid):
    """Return the RANK a launched process runs as (None where /proc is missing)."""
    try:
        with open(f'/proc/{pid}/environ', 'rb') as f:
            items = f.read().split(b'\0')
    except OSError:
        return None
    env = dict(item.decode().split('=', 1) for item in items if b'=' in item)
    return int(env['RANK'])


def port_of(procs):
    for p in procs:
        for word in p.cmd.split():
            if word.startswith('--master-port='):
                return int(word.split('=')[1])
    raise AssertionError('no --master-port in the command lines')


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
    assert argv[:3] == [sys.executable, str(ROOT / 'd2lpar' / 'programs' / 'start_agent.py'), str(os.getpid())]
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


@posix_only
def test_a_rank_killed_from_outside_stops_the_launch():
    outcome = {}
    thread = threading.Thread(
        target=lambda: outcome.update(result=launch(PROBE, nproc=2, args=['--mode', 'hang'], timeout=120, echo=False))
    )
    thread.start()
    procs = workers_of(f'{os.getpid()}-', 3)
    ranks = [p for p in procs if 'torch.distributed.run' not in p.cmd]
    killed_rank = rank_of(ranks[0].pid)
    os.kill(ranks[0].pid, signal.SIGKILL)  # as the kernel's OOM killer would
    thread.join(timeout=60)
    result = outcome['result']
    assert result.returncode != 0 and not result.timed_out
    assert any('SIGKILL' in line for line in result.output['torchrun'])
    if killed_rank is not None:  # no error of its own: torchrun's root cause names it
        assert result.first_failure == killed_rank
    assert port_is_free(result.port)


@posix_only
def test_the_timeout_ends_ranks_that_ignore_sigterm():
    start = time.monotonic()
    result = launch(PROBE, nproc=2, args=['--mode', 'stubborn'], timeout=6, grace=2, echo=False)
    assert result.timed_out and not result.ok
    assert time.monotonic() - start < 6 + 2 + 10  # timeout, grace, then SIGKILL
    assert any('timeout after 6 s' in line for line in result.output['d2lpar.launch'])
    assert port_is_free(result.port)
    with pytest.raises(RuntimeError, match='timed out'):
        result.check()


@posix_only
def test_keyboard_interrupt_ends_every_process_then_propagates():
    seen = {}

    def interrupt_when_running():
        procs = workers_of(f'{os.getpid()}-', 3)  # torchrun and its two ranks
        seen['procs'], seen['port'] = procs, port_of(procs)
        time.sleep(1.0)  # let the ranks install their SIGTERM-ignoring handler
        _thread.interrupt_main()  # what a kernel interrupt does: KeyboardInterrupt in main

    watcher = threading.Thread(target=interrupt_when_running, daemon=True)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        launch(PROBE, nproc=2, args=['--mode', 'stubborn'], timeout=120, grace=2, echo=False)
    watcher.join()
    assert len(seen['procs']) >= 3 and launched_processes() == []
    assert port_is_free(seen['port'])


LAUNCHER_PROCESS = textwrap.dedent('''
    import sys
    from d2lpar.launch import launch
    try:
        launch(sys.argv[1], nproc=2, args=['--mode', 'hang'], timeout=120, grace=2)
    except KeyboardInterrupt:
        print('launcher saw KeyboardInterrupt', flush=True)
        sys.exit(130)
''')


def start_launcher_process():
    """Start a Python process that launches the probe, in a process group of its own."""
    return subprocess.Popen(
        [sys.executable, '-c', LAUNCHER_PROCESS, str(PROBE)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@posix_only
def test_sigint_to_the_launching_process_group_cleans_up():
    proc = start_launcher_process()
    try:
        procs = workers_of(f'{proc.pid}-', 3)
        port = port_of(procs)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)  # what Jupyter's interrupt button sends
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out
    assert 'interrupted: stopping torchrun' in out and 'launcher saw KeyboardInterrupt' in out
    assert launched_processes(f'{proc.pid}-') == []
    assert port_is_free(port)


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='PR_SET_PDEATHSIG is Linux')
def test_a_killed_launcher_takes_torchrun_and_its_ranks_with_it():
    proc, procs = start_launcher_process(), []
    try:
        procs = workers_of(f'{proc.pid}-', 3)
        port = port_of(procs)
        time.sleep(1.0)  # past torchrun's start-up (SIGTERM while it starts workers loses some)
        proc.kill()  # as when a kernel is restarted: no chance to clean up
        proc.wait()
        wait_for(lambda: launched_processes(f'{proc.pid}-') == [], 30)
    finally:
        end_processes(launched_processes(f'{proc.pid}-'), grace=0.1)
        for suffix in {p.launch_id.split('-')[1] for p in procs}:  # the launcher could not
            shutil.rmtree(Path(tempfile.gettempdir()) / f'd2lpar-launch-{suffix}')  # clean up
    assert wait_for(lambda: port_is_free(port), 10)


@posix_only
def test_a_launch_first_ends_what_launches_of_dead_processes_left():
    gone = subprocess.run(
        [sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True, check=True
    )
    dead_owner = int(gone.stdout)  # a pid whose process has exited
    orphan = subprocess.Popen(
        [sys.executable, '-c', 'import time; time.sleep(300)'],
        env={**os.environ, 'D2LPAR_LAUNCH_ID': f'{dead_owner}-old-launch'},
        start_new_session=True,
    )
    try:
        wait_for(lambda: launched_processes(f'{dead_owner}-'), 30)
        result = launch(PROBE, nproc=1, args=['--mode', 'quick'], timeout=120, echo=False)
        assert orphan.wait(timeout=10) is not None
        assert any(str(orphan.pid) in line for line in result.output['d2lpar.launch'])
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


@posix_only
def test_two_launches_at_once_stay_apart():
    results = [None, None]

    def run(i):
        results[i] = launch(PROBE, nproc=2, args=['--mode', 'dist'], timeout=180, echo=False)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.ok for r in results), [r.text() for r in results]
    assert results[0].port != results[1].port
    assert results[0].launch_id != results[1].launch_id
    for r in results:  # each launch's ranks met each other, not the other launch's
        assert r.by_rank('total') == {0: 3.0, 1: 3.0}
    assert all(port_is_free(r.port) for r in results)


@posix_only
def test_a_port_in_use_fails_fast_and_starts_nothing():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        s.listen()
        taken = s.getsockname()[1]
        assert not port_is_free(taken)
        start = time.monotonic()
        result = launch(PROBE, nproc=1, args=['--mode', 'quick'], timeout=120, port=taken, echo=False)
        assert time.monotonic() - start < 10
        assert not result.ok and not result.timed_out and result.commands == []
        message = result.output['d2lpar.launch'][0]
        assert f'cannot listen on 127.0.0.1:{taken}' in message and 'EADDRINUSE' in message
        with pytest.raises(RuntimeError, match='nothing started'):
            result.check()
    # the default port is one the launcher already holds when torchrun starts: no race
    result = launch(PROBE, nproc=1, args=['--mode', 'quick'], timeout=120, echo=False)
    assert result.ok and result.output[0][0].startswith('hello from rank 0')


def test_end_processes_wants_what_launched_processes_returns():
    assert end_processes([]) == []
    with pytest.raises(TypeError, match='pass the processes d2lpar.launched_processes'):
        end_processes([os.getpid()])


LOOPBACK = {
    '0100007F',  # 127.0.0.1 as /proc/net/tcp writes it
    '00000000000000000000000001000000',  # ::1
    '0000000000000000FFFF00000100007F',
}  # ::ffff:127.0.0.1


def listening_sockets(pids):
    """Return {(pid, address, port)} of the TCP sockets the processes `pids` listen on."""
    listening = {}
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == '0A':  # LISTEN
                address, port = fields[1].rsplit(':', 1)
                listening[fields[9]] = (address, int(port, 16))
    found = set()
    for pid in pids:
        try:
            fds = os.listdir(f'/proc/{pid}/fd')
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f'/proc/{pid}/fd/{fd}')
            except OSError:
                continue
            if target.startswith('socket:[') and target[8:-1] in listening:
                found.add((pid, *listening[target[8:-1]]))
    return found


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='reads /proc/net/tcp')
@pytest.mark.parametrize('nnodes', [1, 2])
def test_a_launch_listens_on_loopback_only(nnodes):
    outcome = {}
    thread = threading.Thread(
        target=lambda: outcome.update(
            result=launch(PROBE, nproc=2 // nnodes, nnodes=nnodes, args=['--mode', 'listen'], timeout=120, echo=False)
        )
    )
    thread.start()
    seen = set()
    while thread.is_alive():  # the launcher (this process) hosts the store; ranks hold gloo's
        seen |= listening_sockets([os.getpid()] + [p.pid for p in launched_processes()])
        time.sleep(0.2)
    thread.join()
    result = outcome['result']
    assert result.ok, result.text()
    exposed = sorted((pid, address, port) for pid, address, port in seen if address not in LOOPBACK)
    assert exposed == [], f'listening beyond loopback: {exposed}'
    assert any(port == result.port and pid == os.getpid() for pid, _, port in seen)
    assert len({port for _, _, port in seen}) >= 2  # the store and gloo's pair listeners
    assert not any('TORCHELASTIC_USE_AGENT_STORE' in line for line in result.text().splitlines())
    assert port_is_free(result.port)  # the store ended with the launch
