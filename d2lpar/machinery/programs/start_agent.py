"""Run by d2lpar.launch before torchrun, then become it through exec.

On Linux, ask for SIGTERM when the launching process dies, so that a restarted kernel does
not leave torchrun running.

    python start_agent.py PARENT_PID torchrun ARGS...
"""

import os
import sys

if sys.platform.startswith('linux'):
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    if os.getppid() != int(sys.argv[1]):
        sys.exit(143)
os.execv(sys.argv[2], sys.argv[2:])
