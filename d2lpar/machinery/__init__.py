"""The course's machinery: what the notebooks use and no notebook teaches. Importing it imports nothing.

launch.py         `d2lpar.launch`: a script as N ranks through torchrun, with nothing left behind
launch_commands.py  launch's arguments checked, and the command line of each process it starts
launch_output.py  LaunchResult, the ranks' output streams as one ordered text, their results
ports.py          free ports, the loopback interface and the store of a launch's rendezvous
processes.py      find and end the processes of launches; the one `env` convention of every launcher
ranks.py          where a launched rank stands: dist_env, torch_env_from_slurm, pick_backend, ...
results.py        what a rank hands back and how it leaves: emit_result, exit_now, count_calls
masks.py          run_with_mask(s): children that each start with their own CUDA_VISIBLE_DEVICES
saving.py         files written whole or not at all; save_cells and write_next for launched scripts
info.py           `python -m d2lpar info` and each notebook's first cell (show_setup)
render.py         `python -m d2lpar html`: the course executed into a static site (render_pages.py, render_cache.py)
programs/         programs run by path in child processes (rank shim, agent wrapper, mask child)

d2lpar.distributed and d2lpar.saving are the names scripts import (re-exports of ranks.py,
results.py and saving.py).
"""
