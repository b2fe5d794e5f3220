"""Run in every rank by d2lpar.launch, copied under the script's name.

Send this process's output to a file of its own, then run the script
as `python script args` would (legacy `--local-rank=N` goes right after the script name).
Once the script and its atexit handlers are done, the rank ends with os._exit: a gloo
thread still releasing a collective's tensors while Python shuts down can abort the rank
("terminate called without an active exception": about one short DDP run in ten on a busy
2-core machine; pytorch/pytorch#190489 narrows it to torch's interpreter hooks and the
autograd engine stopping during interpreter finalisation). Processes a rank starts itself
(mp.spawn) need d2lpar.distributed.exit_now.
Before leaving, C stdio is flushed too: into a file it is fully buffered, and os._exit would
drop what C code (NCCL_DEBUG=INFO) printed. When one rank fails, torchrun stops the others
with SIGTERM, possibly before they report their own error: a stopped rank says so in its
output, and every rank that ends badly records how and when (LaunchResult.first_failure).
"""

import atexit
import json
import os
import runpy
import signal
import sys
import time

argv = sys.argv[1:]
legacy = []
while argv and argv[0].startswith(('--local-rank=', '--local_rank=')):
    legacy.append(argv.pop(0))
name = 'rank' + os.environ['RANK'] if 'RANK' in os.environ else 'main'
fd = os.open(os.path.join(os.environ['D2LPAR_LOG_DIR'], name + '.log'), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
sys.stdout.flush()
sys.stderr.flush()
os.dup2(fd, 1)
os.dup2(fd, 2)
os.close(fd)
sys.argv = [argv[0]] + legacy + argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
del argv, legacy, fd


def flush_all():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:  # C libraries (NCCL's INFO lines) print through C stdio, fully buffered into a file
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass


def record_exit(how, code):  # how this rank ended, and when: LaunchResult.exits
    path = os.path.join(os.environ['D2LPAR_EXIT_DIR'], name + '.json')
    try:
        with open(path + '.part', 'w') as f:
            json.dump({'how': how, 'code': code, 'time': time.time()}, f)
        os.replace(path + '.part', path)
    except OSError:
        pass


def stopped(signum, frame):  # torchrun stops the other ranks with SIGTERM once one fails
    os.write(
        2,
        b'[rank_shim.py of d2lpar.launch: stopped by SIGTERM; torchrun sends it to every '
        b'rank once one has failed, or the launch was ended]\n',
    )
    record_exit('stopped', 128 + signum)
    flush_all()
    os._exit(128 + signum)


def show_from_script(kind, value, tb):  # a traceback starts at the script, not in this shim
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename != sys.argv[0]:
        first = first.tb_next
    sys.__excepthook__(kind, value.with_traceback(first or tb), first or tb)


sys.excepthook = show_from_script
exit_code = [0]


def skip_cpp_teardown():  # registered first, so it runs after every other atexit handler
    flush_all()
    os._exit(exit_code[0])


atexit.register(skip_cpp_teardown)
if 'RANK' in os.environ:
    signal.signal(signal.SIGTERM, stopped)
try:
    runpy.run_path(sys.argv[0], run_name='__main__')
except SystemExit as e:
    exit_code[0] = e.code if isinstance(e.code, int) else int(e.code is not None)
    if exit_code[0]:
        record_exit('error', exit_code[0])
    raise
except KeyboardInterrupt:
    exit_code[0] = 130
    record_exit('interrupted', 130)
    raise
except BaseException:
    exit_code[0] = 1
    record_exit('error', 1)
    raise
