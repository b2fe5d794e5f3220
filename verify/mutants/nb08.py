"""Planted bugs for notebook 8, LeNet with a hand-written allreduce."""
from verify.mutants.registry import Mutant

NB = '08_lenet_data_parallel'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant('lenet-replicas-alias-on-cpu', NB, 'each replica is a copy, even on the CPU', FILE,
           old='new_params = [p.detach().to(device, copy=True) for p in params]',
           new='new_params = [p.detach().to(device) for p in params]',
           catch='assert all(q.data_ptr() != p.data_ptr() for p, q in zip(params, replica))',
           quick=True),
    Mutant('allreduce-not-copied-back', NB, 'after allreduce every device holds the sum', FILE,
           old='            data[i].copy_(data[0])', new='            pass',
           catch='assert all(g.tolist() == [11.0, 22.0, 33.0] for g in grads)'),
    Mutant('step-divides-by-the-local-batch', NB, 'one data-parallel step equals one SGD step', FILE,
           old='d2lpar.sgd(params, lr, X.shape[0])', new='d2lpar.sgd(params, lr, X_shards[0].shape[0])',
           catch='torch.testing.assert_close(p.detach().cpu(), q, rtol=1e-10, atol=1e-12)'),
    Mutant('per-shard-mean-loss', NB, 'one data-parallel step equals one SGD step', FILE,
           old="ls = [F.cross_entropy(lenet(X_shard, params), y_shard, reduction='sum')",
           new="ls = [F.cross_entropy(lenet(X_shard, params), y_shard, reduction='mean')",
           catch='torch.testing.assert_close(p.detach().cpu(), q, rtol=1e-10, atol=1e-12)'),
    Mutant('stale-replica', NB, 'every replica takes the same step', FILE,
           old='    for params in device_params:  # the same update everywhere',
           new='    for params in device_params[:1]:  # the same update everywhere',
           catch='torch.testing.assert_close(p.detach().cpu(), q, rtol=1e-10, atol=1e-12)'),
    Mutant('labels-split-out-of-step', NB, 'examples and labels are cut at the same rows', FILE,
           old='    return scatter(X, devices), scatter(y, devices)',
           new='    return scatter(X, devices), scatter(y.flip(0), devices)',
           catch='torch.testing.assert_close(X_shard.cpu(), X[y_shard.cpu()], rtol=0, atol=0)'),
]
