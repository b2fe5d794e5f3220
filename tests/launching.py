"""What test_launch.py and test_launch_cleanup.py share: the probe script and the leak check."""

import os
from pathlib import Path

import pytest

from d2lpar import launched_processes

HERE = Path(__file__).resolve().parent
PROBE = HERE / 'scripts' / 'launch_probe.py'
ROOT = HERE.parent
posix_only = pytest.mark.skipif(os.name != 'posix', reason='the launcher needs Linux or macOS')


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """Fail a test after which a launch's processes are still running."""
    yield
    assert launched_processes() == [], 'a launch left processes running'
