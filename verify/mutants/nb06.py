"""Planted bugs for notebook 6, launching, failures and restarts."""
from verify.mutants.registry import Mutant

NB = '06_ddp_launching'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant('restart-resumes-a-step-early', NB, 'a restart resumes at the lost epoch, bit-exact', FILE,
           old="    return state['epoch'] + 1", new="    return state['epoch']",
           catch="assert {done[r]['first_epoch'] for r in (0, 1)} == {fail_at}"),
    Mutant('restart-loses-optimizer-state', NB, 'a restart resumes at the lost epoch, bit-exact', FILE,
           old="    optimizer.load_state_dict(state['optimizer'])\n", new='',
           catch="assert {done[r]['first_epoch'] for r in (0, 1)} == {fail_at}"),
    Mutant('mismatch-without-detail', NB, 'DETAIL names the shapes on every rank', FILE,
           old="env={'TORCH_DISTRIBUTED_DEBUG': 'DETAIL'}", new="env={}",
           catch="assert re.search(r'\\b1\\b', report[0]['barrier'])"),
    Mutant('torchrun-stopped-politely', NB, 'a killed torchrun leaves its workers behind', FILE,
           old="terminal.kill()  # kill -9", new="terminal.terminate()  # kill -9",
           catch="assert stale and all(p.ppid != terminal.pid for p in stale)"),
    Mutant('slurm-local-rank-from-procid', NB, "SLURM's variables map to rank and local rank",
           'd2lpar/distributed.py', old="    local_rank = _int_var(environ, 'SLURM_LOCALID')",
           new="    local_rank = _int_var(environ, 'SLURM_PROCID')",
           catch="assert [e.rank for e in mapped] == [0, 1, 2, 3]", quick=True),
]
