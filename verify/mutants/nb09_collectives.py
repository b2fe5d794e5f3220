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
