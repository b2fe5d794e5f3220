"""Run a script as N processes through torchrun from a notebook, and leave nothing behind.

    result = d2lpar.launch('scripts/ddp_torchrun.py', nproc=2, args=['--epochs', '2'],
                           timeout=120)
    result.returncode, result.ok, result.timed_out, result.port, result.commands
    result.output[0]          # lines rank 0 printed (its stdout and stderr)
    result.output['torchrun'] # what torchrun itself printed
    result.first_failure      # the rank that failed first (torchrun then stops the others)
    result.results            # JSON objects the ranks passed to d2lpar.distributed.emit_result
    result.by_rank('loss')    # {rank: 'loss' of that rank's last result}
    result.check()            # raise RuntimeError showing the output if it failed

What a launch adds to the torchrun you would type, all of it in `result.commands`
(the exact command each started process ran) and `result.env` (what it changed in the
environment):
- torchrun runs as `python -m torch.distributed.run`, started through
  programs/start_agent.py, which on Linux asks for SIGTERM if the kernel dies and then
  execs torchrun; torchrun runs in a session of its own, so a kernel interrupt reaches the
  launcher and not torchrun;
- each rank runs programs/rank_shim.py, copied under the script's name, with the script
  after it: it sends the rank's stdout and stderr to a file of its own (the launcher tails
  those files and prints every line prefixed by its rank from the calling thread, which is
  what reaches a notebook cell), says so when SIGTERM stops the rank, starts tracebacks at
  the script, and ends the rank with os._exit once the script and its atexit handlers are
  done (see the shim's docstring for why);
- the rendezvous store is hosted by the launching process on 127.0.0.1
  (`_loopback_store` in ports.py, TORCHELASTIC_USE_AGENT_STORE=True), and the one log line torch
  writes about it in every process is left out;
- the environment: OMP_NUM_THREADS=1, MASTER_ADDR/MASTER_PORT, GLOO_SOCKET_IFNAME and
  NCCL_SOCKET_IFNAME set to loopback, TORCH_ELASTIC_SHUTDOWN_TIMEOUT from `grace`, and the
  D2LPAR_* names the shim and the scripts read: where ranks write their output, results
  (`d2lpar.distributed.emit_result`) and exit status, the launch's id, and
  D2LPAR_DIST_TIMEOUT, which keeps init_process_group's timeout below the launch's
  (`d2lpar.distributed.default_timeout`).

Every process of a launch carries D2LPAR_LAUNCH_ID in its environment. When a
rank crashes, the timeout fires or the caller is interrupted (KeyboardInterrupt),
the launcher sends SIGTERM to torchrun (which stops its workers, each in a
session of its own), waits `grace` seconds, then finds every process still
carrying the launch's id, ends it (SIGTERM, then SIGKILL) and finally kills
torchrun. On Linux torchrun is also asked to receive SIGTERM if the launching
process dies (a kernel restart), and every launch first ends whatever earlier
launches of Python processes that have died left behind. `launched_processes()`
lists what is left (it should be nothing) and `end_processes` ends it; both read
/proc on Linux and `ps` elsewhere. Windows is not supported (use WSL there).
"""

import errno
import os
import shlex
import shutil
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path

from .launch_commands import _changes, _commands, _popen, _wrapped, check_launch
from .launch_output import LaunchResult, _collect_exits, _collect_results, _Streams
from .ports import _loopback_store, free_port, loopback_interface, port_is_free
from .processes import MARKER, _end_orphans, _wait_until, end_processes, launched_processes

__all__ = [
    'LaunchResult',
    'launch',
    'free_port',
    'port_is_free',
    'launched_processes',
    'end_processes',
    'loopback_interface',
]

# Runs in every rank, copied under the script's name: see its docstring.
_RANK_SHIM = Path(__file__).with_name('programs') / 'rank_shim.py'

# ---------------------------------------------------------------- one launch


def _shutdown(agents, launch_id, grace):
    """Stop a launch: SIGTERM torchrun, then end whatever carries the launch id, then kill."""
    blocked = threading.current_thread() is threading.main_thread() and hasattr(signal, 'pthread_sigmask')
    if blocked:  # a second interrupt must not cut the clean-up short; it is raised after
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for agent in agents:
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
        _wait_until(lambda: all(a.poll() is not None for a in agents), grace)
        end_processes([p for p in launched_processes(launch_id) if p.pid not in {a.pid for a in agents}], grace=2.0)
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
            agent.wait()
        end_processes(launched_processes(launch_id), grace=1.0)
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _launch_once(script, nproc, nnodes, args, timeout, env, echo, launcher, port, grace, max_restarts=0):
    work = tempfile.mkdtemp(prefix='d2lpar-launch-')
    suffix = os.path.basename(work)[len('d2lpar-launch-') :]
    launch_id = f'{os.getpid()}-{suffix}-{uuid.uuid4().hex[:6]}'
    agents, readers = [], []
    streams = None
    stores = []  # the launch's store, held until the launch ends
    start = time.monotonic()
    timed_out = False
    commands, started, env_changes = [], [], {}
    try:
        log_dir, result_dir = os.path.join(work, 'logs'), os.path.join(work, 'results')
        exit_dir = os.path.join(work, 'exits')
        for directory in (log_dir, result_dir, exit_dir):
            os.mkdir(directory)
        os.mkdir(os.path.join(work, 'shim'))
        shutil.copyfile(_RANK_SHIM, os.path.join(work, 'shim', script.name))
        streams = _Streams(log_dir, echo)
        try:
            store, port = _loopback_store(port, timeout)
            stores.append(store)
            del store
        except OSError as e:
            streams.add(
                'd2lpar.launch',
                f'cannot listen on 127.0.0.1:{port}: {e.strerror} '
                f'({errno.errorcode.get(e.errno, e.errno)}): another '
                f'program uses that port; pass another port, or '
                f'port=None for a free one',
            )
            return LaunchResult(1, streams.output, [], False, port, [], 0.0, launch_id)
        child_env = dict(os.environ)
        child_env.update(
            {
                'OMP_NUM_THREADS': '1',
                MARKER: launch_id,
                'D2LPAR_LOG_DIR': log_dir,
                'D2LPAR_RESULT_DIR': result_dir,
                'D2LPAR_EXIT_DIR': exit_dir,
                'D2LPAR_DIST_TIMEOUT': f'{max(1.0, 0.75 * timeout):g}',
                'TORCH_ELASTIC_SHUTDOWN_TIMEOUT': str(max(1, int(grace / 2))),
                # Everything on loopback: the store (see _loopback_store), and the
                # sockets gloo and NCCL open between ranks.
                'MASTER_ADDR': '127.0.0.1',
                'MASTER_PORT': str(port),
                'GLOO_SOCKET_IFNAME': loopback_interface(),
                'NCCL_SOCKET_IFNAME': loopback_interface(),
            }
        )
        if launcher != 'python':
            # Only torchrun's agents and ranks look for the launcher's store. A plain script
            # (mp.spawn with its own tcp:// address) must host its own: torch 2.13 applies
            # the flag to any address, so a rank there would wait for a store nobody hosts
            # (2.14 added the address check, rendezvous.py `_agent_store_serves`).
            child_env['TORCHELASTIC_USE_AGENT_STORE'] = 'True'
        for key, value in env.items():
            if value is None:
                child_env.pop(key, None)
            else:
                child_env[key] = value
        commands = _commands(script, nproc, nnodes, args, launcher, port, work, max_restarts)
        env_changes = _changes(child_env, os.environ)
        _end_orphans(lambda text: streams.add('d2lpar.launch', text))
        for name, argv in commands:
            started.append(_wrapped(argv))
            agent = _popen(started[-1], child_env)
            agents.append(agent)
            reader = threading.Thread(target=streams.read_pipe, args=(name, agent.stdout), daemon=True)
            reader.start()
            readers.append(reader)
        deadline = start + timeout
        while any(agent.poll() is None for agent in agents):
            streams.pump()
            if time.monotonic() > deadline:
                timed_out = True
                streams.add('d2lpar.launch', f'timeout after {timeout:g} s: stopping all processes')
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        if streams is not None:
            streams.add('d2lpar.launch', 'interrupted: stopping torchrun and its workers')
        raise
    finally:
        try:
            _shutdown(agents, launch_id, grace)
            if stores:
                stores.clear()  # closes the store and its port: it lives no longer than the launch
                # the store's server thread lets go of the socket a moment later: return only
                # once the port is free, as promised (a busy machine made that moment visible)
                _wait_until(lambda: port_is_free(port), 5.0)
            for reader in readers:
                reader.join(timeout=5)
            if streams is not None and os.path.isdir(os.path.join(work, 'logs')):
                streams.pump(final=True)
            results = (
                _collect_results(os.path.join(work, 'results')) if os.path.isdir(os.path.join(work, 'results')) else []
            )
            exits = _collect_exits(os.path.join(work, 'exits'))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    codes = [agent.returncode for agent in agents]
    returncode = next((c for c in codes if c != 0), 0)
    return LaunchResult(
        returncode,
        streams.output,
        results,
        timed_out,
        port,
        [shlex.join(argv) for argv in started],
        time.monotonic() - start,
        launch_id,
        exits,
        env_changes,
    )


def launch(
    script,
    nproc=2,
    args=(),
    timeout=120,
    env=None,
    echo=True,
    *,
    nnodes=1,
    launcher='torchrun',
    port=None,
    grace=5.0,
    max_restarts=0,
):
    """Run `script` as `nproc` processes (per node) through torchrun; return a LaunchResult.

    Each rank's output is printed as it comes, prefixed by its rank (`echo`).
    `timeout` (s) bounds the whole launch, and D2LPAR_DIST_TIMEOUT (read by
    `d2lpar.distributed.default_timeout`) is set to 0.75 of it unless `env`
    sets it; `env` adds variables (None unsets one); `nnodes` > 1 starts that
    many torchrun "nodes" on 127.0.0.1 (`--node-rank` 0, 1, ...). `launcher` is
    'torchrun', the deprecated 'torch.distributed.launch', or 'python' (one
    plain process that starts its own workers, e.g. with mp.spawn;
    MASTER_ADDR/MASTER_PORT are set for it). Everything listens on loopback
    only: the launcher hosts the rendezvous store on 127.0.0.1:`port` (a free
    port by default) while the launch runs, and gloo and NCCL are told to use
    the loopback interface (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME; `env` can
    override them). `max_restarts` is passed to torchrun as --max-restarts:
    when a rank fails, torchrun stops the group and starts every rank again, at
    most that many times (each attempt sees TORCHELASTIC_RESTART_COUNT), and
    `timeout` bounds all attempts together. On a crash (once no restart is
    left), a timeout or KeyboardInterrupt every process of the launch is ended
    (SIGTERM to torchrun, `grace` s, then SIGKILL); an interrupt is re-raised
    afterwards.
    """
    script, nproc, nnodes, args, env, timeout, grace = check_launch(
        script, nproc, nnodes, args, env, timeout, grace, launcher, port, max_restarts
    )
    return _launch_once(script, nproc, nnodes, args, timeout, env, echo, launcher, port, grace, max_restarts)
