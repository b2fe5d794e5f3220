"""d2lpar.launch leaves nothing behind: a rank killed, a timeout, an interrupt, a killed launcher,
leftovers of dead launches, two launches at once, a port in use, and listening on loopback only.

Each test checks afterwards that none of its processes survives and that the port is free again.
"""

import _thread
import os
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

from d2lpar import end_processes, launch, launched_processes, port_is_free

from launching import PROBE, ROOT, nothing_left_behind, posix_only  # noqa: F401  (an autouse fixture)


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
    from d2lpar import launch
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
