"""Ports and interfaces for a launch's rendezvous: free ports, the loopback interface, the store."""

import os
import socket
import sys


def free_port(host='127.0.0.1'):
    """Return a TCP port on `host` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port, host='127.0.0.1'):
    """Return True if a server could listen on `host:port` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if os.name == 'posix':  # as TCPStore does: old TIME_WAIT connections do not count
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError:
            return False
    return True


def loopback_interface():
    """Return the name of the loopback network interface ('lo' on Linux, 'lo0' on macOS)."""
    names = [name for _, name in socket.if_nameindex()] if hasattr(socket, 'if_nameindex') else []
    for name in names:
        if name.startswith('lo'):
            return name
    return 'lo0' if sys.platform == 'darwin' else 'lo'


def _loopback_store(port, timeout):
    """Host the launch's rendezvous store on 127.0.0.1 only; return (store, port).

    Left to itself, torchrun's agent (or rank 0 under mp.spawn) hosts the store
    with TCPStore, which listens on every interface (*:PORT): anyone who can
    reach the machine could reach the job. TCPStore listens where it is told
    only when handed a listening socket (`master_listen_fd`), so the launcher
    binds one to 127.0.0.1 and hosts the store itself for as long as the launch
    runs. The agents and ranks find it through TORCHELASTIC_USE_AGENT_STORE=True
    with MASTER_ADDR/MASTER_PORT naming it: TCPStore then treats the failed bind
    of a would-be server as "the agent serves this store" and connects as a
    client (torch/distributed/rendezvous.py, `_agent_store_serves`).
    """
    import datetime

    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if os.name == 'posix':  # as TCPStore does: old TIME_WAIT connections do not count
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(('127.0.0.1', port or 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    port = sock.getsockname()[1]
    fd = sock.detach()  # the store owns the socket now and closes it when it ends
    try:
        store = dist.TCPStore(
            '127.0.0.1',
            port,
            None,
            True,
            wait_for_workers=False,
            multi_tenant=True,
            master_listen_fd=fd,
            timeout=datetime.timedelta(seconds=timeout),
        )
    except BaseException:
        os.close(fd)
        raise
    return store, port
