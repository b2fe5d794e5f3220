"""Planted bugs for notebook 5, DistributedDataParallel for real."""
from verify.mutants.registry import Mutant

NB = '05_ddp'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant('every-rank-reads-shard-0', NB, 'two processes train as one on the global batch', FILE,
           old='num_replicas=num_replicas, rank=rank,', new='num_replicas=num_replicas, rank=0,',
           catch='assert not shards[0] & shards[1]', quick=True),
    Mutant('local-batch-is-the-global-batch', NB, 'two processes train as one on the global batch',
           'notebooks/scripts/common.py', old='    return batch_size // world_size\n',
           new='    return batch_size\n', catch='assert not shards[0] & shards[1]'),
    Mutant('reported-loss-missing-1-over-n', NB, 'the loss reported is the mean over all ranks', FILE,
           old='losses[epoch] = total.item() / (n * world_size)', new='losses[epoch] = total.item() / n',
           catch='assert not shards[0] & shards[1]'),
    Mutant('syncbn-unweighted-mean', NB, 'SyncBatchNorm by hand normalises over the global batch',
           'notebooks/scripts/ddp_anatomy.py', old='    mean = (counts * means).sum(0) / n\n',
           new='    mean = means.mean(0)\n', catch='torch.testing.assert_close(Y, bn(X), **tol)'),
    Mutant('syncbn-variance-without-spread-of-means', NB,
           'SyncBatchNorm by hand normalises over the global batch', 'notebooks/scripts/ddp_anatomy.py',
           old='    var = (counts * (variances + (means - mean) ** 2)).sum(0) / n',
           new='    var = (counts * variances).sum(0) / n',
           catch='torch.testing.assert_close(Y, bn(X), **tol)'),
    Mutant('checkpoint-saved-with-module-prefix', NB, "the checkpoint has no 'module.' prefix",
           'notebooks/scripts/ddp_spawn.py',
           old='common.save_checkpoint(args.ckpt, net.module, optimizer, epoch)',
           new='common.save_checkpoint(args.ckpt, net, optimizer, epoch)',
           catch="assert state['epoch'] == epochs - 1 and not any(k.startswith('module.')"),
]
