"""Test-suite settings shared by the unit tests and the notebooks run by nbval.

Kernels started by nbval inherit this environment: notebooks then use the
offline Fashion-MNIST stand-in and their small workload (see README).
"""

import os
import signal
import threading
import warnings

import pytest

os.environ['D2LPAR_OFFLINE'] = '1'
os.environ['D2LPAR_SMALL'] = '1'
os.environ.setdefault('MPLBACKEND', 'Agg')


class NotebookTimes:
    """Add up the time of each notebook's cells and print it at the end (budget: 90 s each)."""

    def __init__(self):
        self.seconds = {}

    def pytest_runtest_logreport(self, report):
        path = report.nodeid.split('::')[0]
        if path.endswith('.ipynb'):  # setup, call and teardown of every cell
            self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter):
        if self.seconds:
            terminalreporter.section('seconds per notebook (budget: about 60, at most 90)')
            for path, total in sorted(self.seconds.items()):
                terminalreporter.write_line(f'{total:6.1f}  {path}')


def pytest_configure(config):
    config.pluginmanager.register(NotebookTimes(), 'd2lpar-notebook-times')
    # A shell without job control starts a background job (`make test &`, nohup) with SIGINT
    # ignored, and children inherit that: the tests of what an interrupt does (the learner's
    # interrupt button) would then wait forever. Take SIGINT as an interactive session has it.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _sigint_as_found(request):
    """Restore SIGINT's handler and mask if a test changed them, and warn which test did.

    Children inherit an ignored or blocked SIGINT: a leak would make every later interrupt
    test (a learner's interrupt button, in a kernel) wait forever, far from its cause.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, 'pthread_sigmask'):
        yield
        return
    handler = signal.getsignal(signal.SIGINT)
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    now = signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if now != (handler, blocked):
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_BLOCK if blocked else signal.SIG_UNBLOCK, {signal.SIGINT})
        warnings.warn(f'{request.node.nodeid} changed SIGINT (handler, blocked) from {(handler, blocked)} to {now}')
