"""The pieces of `make gpucheck` (verify/gpucheck.py, its command line), one idea each.

rows.py           the table: which notebook or script each row runs, on how many GPUs, checked how
checks.py         what the ranks of a row's script must hand back (notebooks 5-9, 14)
script_checks.py  what the scripts notebooks 10-14 write must hand back (`gpucheck.py script`)
scripts.py        `gpucheck.py script`: write a notebook's %%writefile script, launch it, check it
machine.py        the driver asked before any row: GPUs it lists, and why torch cannot use them
running.py        one row run in a session of its own, ended on timeout, its results checked
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / 'notebooks'
SCRIPTS = NOTEBOOKS / 'scripts'
GPUCHECK = ROOT / 'verify' / 'gpucheck.py'  # the command line; a script row runs its `script`
PORT = '{free_port}'  # in a row's argv: replaced by a free port when the row starts
