"""Test-suite settings shared by the unit tests and the notebooks run by nbval.

Kernels started by nbval inherit this environment: notebooks then use the
offline Fashion-MNIST stand-in and their small workload (see README).
"""

import os

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
