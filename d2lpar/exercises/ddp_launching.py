"""Checker of notebook 6: SLURM's variables mapped to rank, local rank, world size and master."""

import re

from ..machinery.ranks import expand_nodelist, torch_env_from_slurm
from ._verdict import _call, _checker, _Fail

KEYS = ('rank', 'local_rank', 'world_size', 'master_addr')


def _reference(environ):
    """Return what a task started by srun with `environ` is, from d2lpar's tested mapping."""
    env = torch_env_from_slurm(environ)
    return {
        'rank': int(env['RANK']),
        'local_rank': int(env['LOCAL_RANK']),
        'world_size': int(env['WORLD_SIZE']),
        'master_addr': env['MASTER_ADDR'],
    }


def _compress(prefix, numbers, width):
    """Write hosts prefix+number as SLURM does: 'gpu[03-05,07]' (or 'gpu07' for one)."""
    if len(numbers) == 1:
        return f'{prefix}{numbers[0]:0{width}d}'
    parts, start = [], 0
    for i in range(1, len(numbers) + 1):
        if i == len(numbers) or numbers[i] != numbers[i - 1] + 1:
            lo, hi = numbers[start], numbers[i - 1]
            parts.append(f'{lo:0{width}d}' + (f'-{hi:0{width}d}' if hi != lo else ''))
            start = i
    return f'{prefix}[{",".join(parts)}]'


def _random_job(rng):
    """Return (nodelist, tasks_per_node) of a random allocation with zero-padded names."""
    prefix, width = rng.choice([('gpu', 2), ('node', 3), ('a100-', 2), ('cn', 4)])
    nodes = rng.randint(2, 5)
    numbers = sorted(rng.sample(range(1, 60), nodes))
    if rng.random() < 0.3:  # a second group of hosts after the first
        return _compress(prefix, numbers[:-1], width) + ',login' + str(numbers[-1]), rng.randint(1, 4)
    return _compress(prefix, numbers, width), rng.randint(1, 4)


def _environ(nodelist, per_node, procid):
    hosts = expand_nodelist(nodelist)
    ntasks = len(hosts) * per_node
    return {
        'SLURM_PROCID': str(procid),
        'SLURM_NTASKS': str(ntasks),
        'SLURM_LOCALID': str(procid % per_node),
        'SLURM_NODEID': str(procid // per_node),
        'SLURM_NNODES': str(len(hosts)),
        'SLURM_JOB_NUM_NODES': str(len(hosts)),
        'SLURM_NODELIST': nodelist,
        'SLURM_JOB_NODELIST': nodelist,
        'SLURM_TASKS_PER_NODE': f'{per_node}(x{len(hosts)})',
        'SLURM_NTASKS_PER_NODE': str(per_node),
        'SLURM_JOB_ID': '81723',
    }


def _unpadded(name):
    return re.sub(r'(?<![0-9])0+(?=[0-9])', '', name)


def _hint(key, got, environ, want):
    """Explain the usual mistakes behind a wrong value of `key`."""
    value = lambda name: int(environ[name])  # noqa: E731
    hosts = expand_nodelist(environ['SLURM_NODELIST'])
    if key in ('rank', 'local_rank', 'world_size') and isinstance(got, str):
        return f'return {key} as an int, not the string {got!r}: int(os.environ[...]).'
    if key == 'rank':
        if got == value('SLURM_NODEID'):
            return 'SLURM_NODEID numbers the machines; the rank of a process is SLURM_PROCID.'
        if got == value('SLURM_LOCALID'):
            return 'that is the local rank (SLURM_LOCALID); the rank is SLURM_PROCID.'
        return 'the rank is SLURM_PROCID.'
    if key == 'world_size':
        if got == value('SLURM_NNODES'):
            return 'the world size counts processes, not machines: SLURM_NTASKS, not SLURM_NNODES.'
        if got == value('SLURM_NTASKS_PER_NODE'):
            return 'that is the number of tasks on one node; the world size is SLURM_NTASKS.'
        return 'the world size is SLURM_NTASKS, the number of processes in the job.'
    if key == 'local_rank':
        if got == value('SLURM_PROCID'):
            return 'that is the global rank; the local rank (which GPU on this node) is SLURM_LOCALID.'
        return 'the local rank is SLURM_LOCALID.'
    got = str(got)
    if '[' in got or ']' in got or ',' in got:
        return (
            "expand the node list first: 'gpu[03-05,07]' means gpu03, gpu04, gpu05, gpu07, "
            "and the first of them is the master."
        )
    if re.fullmatch(r'[0-9.]+', got):
        return (
            'node names are not IP addresses: gluing the digits of SLURM_NODELIST together '
            'gives no address. Take the first host name of the expanded list.'
        )
    if got == _unpadded(want) and got != want:
        return f'keep the zero padding: the host is {want!r}, not {got!r}.'
    if got in hosts and got == hosts[value('SLURM_NODEID')]:
        return (
            "that is this task's own node; MASTER_ADDR is the same for every task: the "
            'first host of the list, where rank 0 runs.'
        )
    if got == hosts[-1]:
        return 'that is the last host; the master is the first host of the expanded list.'
    return 'the master address is the first host of the expanded SLURM_NODELIST.'


@_checker('slurm_ranks(environ)', 'slurm_ranks')
def check_slurm_ranks(slurm_ranks, rng):
    """Check a mapping from srun's variables to rank, local rank, world size and master address.

    `slurm_ranks(environ)` gets a dict of SLURM_* variables and must return
    {'rank', 'local_rank', 'world_size', 'master_addr'}: SLURM_PROCID,
    SLURM_LOCALID and SLURM_NTASKS as ints, and the first host of the expanded
    SLURM_NODELIST. A task whose SLURM_PROCID is not below SLURM_NTASKS is refused
    with a ValueError.
    """
    jobs = [('gpu[03-05,07]', 2), ('node[008-009],login3', 3), ('gpu17', 4)]
    jobs += [_random_job(rng) for _ in range(3)]
    first = True
    for nodelist, per_node in jobs:
        ntasks = len(expand_nodelist(nodelist)) * per_node
        for procid in range(ntasks):
            environ = _environ(nodelist, per_node, procid)
            case = f'SLURM_NODELIST={nodelist!r}, {per_node} tasks per node, SLURM_PROCID={procid}'
            got = _call(slurm_ranks, (dict(environ),), case, first)
            first = False
            if not isinstance(got, dict):
                raise _Fail(
                    f'{case}: slurm_ranks returned a {type(got).__name__}; return a dict '
                    f'with the keys {", ".join(KEYS)}.'
                )
            missing = [key for key in KEYS if key not in got]
            if missing:
                raise _Fail(
                    f'{case}: the result has no {", ".join(map(repr, missing))}; return '
                    f'a dict with the keys {", ".join(KEYS)}.'
                )
            want = _reference(environ)
            for key in KEYS:
                if got[key] != want[key] or type(got[key]) is not type(want[key]):
                    raise _Fail(
                        f'{case}: {key} is {got[key]!r}, should be {want[key]!r}. '
                        f'Hint: {_hint(key, got[key], environ, want[key])}'
                    )
    bad = _environ('gpu[01-02]', 2, 0)
    bad['SLURM_PROCID'] = '4'
    try:
        slurm_ranks(dict(bad))
    except NotImplementedError:
        raise _Fail('a task with SLURM_PROCID=4: your code raised NotImplementedError; finish it.') from None
    except ValueError:
        pass
    except Exception as e:
        raise _Fail(
            f'a task with SLURM_PROCID=4 of SLURM_NTASKS=4 raised {type(e).__name__}: '
            f'{e}. Hint: refuse it with a ValueError that says the rank must be below '
            'the world size.'
        ) from None
    else:
        raise _Fail(
            'a task with SLURM_PROCID=4 of SLURM_NTASKS=4 was accepted. Hint: ranks go '
            'from 0 to SLURM_NTASKS - 1; raise ValueError for anything else, or the job '
            'hangs waiting for a rank that never comes.'
        )
    return (
        f'{len(jobs)} allocations (zero-padded ranges, several host groups, one node) map '
        'every task to its rank, local rank, world size and master address, and a rank '
        'outside the world is refused.'
    )
