"""Planted bugs for notebook 9, collectives by hand and mini-DDP.

The ring cells (ring_reduce_scatter, ring_all_gather) are left alone here: a
mutant names exact text, and those cells are being reworked elsewhere.
"""

from verify.mutants.registry import Mutant

NB = '09_collectives'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant(
        'ring-cost-counts-one-pass',
        NB,
        'the cost model matches the counted bytes',
        FILE,
        old='return 2 * (n - 1) * latency + 2 * (n - 1) / n * size / bandwidth',
        new='return 2 * (n - 1) * latency + (n - 1) / n * size / bandwidth',
        catch="assert math.isclose(allreduce_cost('ring', n, S, 1), ring['sent'])",
        quick=True,
    ),
    Mutant(
        'naive-allreduce-without-broadcast',
        NB,
        'the hand-written collectives equal torch\'s',
        FILE,
        old='    reduce(tensor, 0, op)\n    return broadcast(tensor, 0)',
        new='    reduce(tensor, 0, op)\n    return tensor',
        catch='assert sorted(checks[n]) == list(range(n))',
    ),
    Mutant(
        'hook-ddp-missing-1-over-n',
        NB,
        'every variant trains as one process',
        FILE,
        old='        dist.all_reduce(p.grad)  # SUM, then divide: gloo\'s AVG is not trusted\n        p.grad /= dist.get_world_size()',
        new='        dist.all_reduce(p.grad)  # SUM, then divide: gloo\'s AVG is not trusted',
        catch='def check_variants(reports, names):',
    ),
    Mutant(
        'bucket-never-reduced-again',
        NB,
        'every variant trains as one process',
        FILE,
        old='        """Get ready for the next backward."""\n        self.ready, self.launched = set(), 0',
        new='        """Get ready for the next backward."""\n        self.ready = set()',
        catch='def check_variants(reports, names):',
    ),
    Mutant(
        'bucket-sum-not-divided',
        NB,
        'every variant trains as one process',
        FILE,
        old='        flat /= dist.get_world_size()\n',
        new='',
        catch='def check_variants(reports, names):',
    ),
    Mutant(
        'first-bucket-empty',
        NB,
        'buckets hold at most the cap, at least one tensor each',
        FILE,
        old='        if buckets[-1] and size + nbytes > bucket_cap_mb * 2**20:',
        new='        if size + nbytes > bucket_cap_mb * 2**20:',
        catch='assert layouts[1e-5] == [1] * 6 and layouts[math.inf] == [6]',
    ),
    Mutant(
        'ring-sends-the-wrong-block',
        NB,
        'after n-1 steps rank r owns the sum of block r',
        FILE,
        old='sent = [(r, (r - step - 1) % n, set(held[r][(r - step - 1) % n])) for r in range(n)]',
        new='sent = [(r, (r - step) % n, set(held[r][(r - step) % n])) for r in range(n)]',
        catch='assert complete == [[r] for r in range(n)]',
    ),
    Mutant(
        'send-recv-ordered-by-rank',
        NB,
        'two ranks that both send first deadlock',
        'notebooks/scripts/collectives_p2p.py',
        old='            dist.send(torch.ones(1), other, group=pair)\n'
        '            dist.recv(torch.empty(1), other, group=pair)\n',
        new='            if rank == 0:\n'
        '                dist.send(torch.ones(1), other, group=pair)\n'
        '                dist.recv(torch.empty(1), other, group=pair)\n'
        '            else:\n'
        '                dist.recv(torch.empty(1), other, group=pair)\n'
        '                dist.send(torch.ones(1), other, group=pair)\n',
        catch="assert stuck is not None and stuck['seconds'] > 1.5",
    ),
    Mutant(
        'mlp-registered-in-forward-order',
        NB,
        'DDP rebuilds its buckets from the arrival order',
        FILE,
        old='        self.output = nn.Linear(512, 10)\n        self.hidden = nn.Sequential(nn.Flatten(), '
        'nn.Linear(784, 512), nn.ReLU(),\n                                    '
        'nn.Linear(512, 512), nn.ReLU())\n',
        new='        self.hidden = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(),\n'
        '                                    nn.Linear(512, 512), nn.ReLU())\n'
        '        self.output = nn.Linear(512, 10)\n',
        catch='assert order != list(range(len(registered)))[::-1]',
    ),
    Mutant(
        'miniddp-does-not-wait',
        NB,
        'MiniDDP waits for its all_reduces before the step',
        FILE,
        old='            work.wait()\n',
        new='',
        catch="assert mini[0]['allreduce_calls'][f'MiniDDP {cap:g} MB'] == len(layouts[cap])",
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = [
    "assert report[1]['received'] == [0.0, 1.0, 2.0, 3.0] and sorted(report[0]['senders']) == [1, 2]",
    "assert all(report[r]['ring']['got'] == [float((r - 1) % 3)] * 3 for r in range(3))",
    "assert all(h == set(range(n)) for row in held for h in row)  # then everyone has everything",
    "assert allreduce_cost('naive', n, 0, 1, latency=1) == naive['messages']  # 2(n-1), one by one",
    "assert allreduce_cost('naive', n, S, 1) == naive['sent'] + naive['received']  # receive, then send",
    "assert allreduce_cost('ring', n, 0, 1, latency=1) == ring['messages'] / 2  # send and receive at once",
    "assert all(r['traffic']['ring'] == ring for r in reports.values())  # the ring loads every rank alike",
    "assert all(r['fingerprint'] == reports[0]['fingerprint'] for r in reports.values())",
    "assert bucketed[0]['backend'] == backend",
    "assert bucketed[0]['allreduce_calls']['HookDDP'] == 6  # one per parameter tensor",
    "assert bucketed[0]['buckets'][f'BucketDDP {cap:g} MB'] == layouts[cap]",
    "assert bucketed[0]['allreduce_calls'][f'BucketDDP {cap:g} MB'] == len(layouts[cap])",
    "assert [i for bucket in rebuilt for i in bucket] == order  # the buckets follow the arrival",
]
