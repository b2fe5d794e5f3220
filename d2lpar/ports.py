"""Ports and interfaces for a launch's rendezvous: free ports and the loopback interface."""

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
