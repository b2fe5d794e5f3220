"""Planted bugs for notebook 7, what real training jobs need."""
from verify.mutants.registry import Mutant

NB = '07_ddp_practice'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant('loader-workers-leave-no-core', NB, 'ranks and their workers fit the cores', FILE,
           old='return max(0, cores // nproc_per_node - 1)', new='return max(0, cores // nproc_per_node)',
           catch='assert nproc * (w + 1) <= max(cores, nproc)', quick=True),
    Mutant('accumulation-missing-1-over-k', NB, 'k accumulated micro-batches equal one big batch', FILE,
           old='loss = loss_fn(net(X), y) / k', new='loss = loss_fn(net(X), y)',
           catch="assert r['calls_no_sync'] == r['buckets']"),
    Mutant('accumulation-syncs-every-micro-batch', NB, 'no_sync skips the allreduce of k-1 micro-batches', FILE,
           old='with contextlib.nullcontext() if last else net.no_sync():',
           new='with contextlib.nullcontext():',
           catch="assert r['calls_no_sync'] == r['buckets']"),
    Mutant('evaluation-counts-the-padding', NB, 'distributed evaluation counts each sample once', FILE,
           old='keep = max(0, min(len(y), num_real - seen))', new='keep = len(y)',
           catch="assert (r['correct'], r['total']) == (r['single_correct'], r['n'])"),
]
