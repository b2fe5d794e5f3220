"""Planted bugs for notebook 7, what real training jobs need."""

from verify.mutants.registry import Mutant

NB = '07_ddp_practice'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant(
        'loader-workers-leave-no-core',
        NB,
        'ranks and their workers fit the cores',
        FILE,
        old='return max(0, cores // nproc_per_node - 1)',
        new='return max(0, cores // nproc_per_node)',
        catch='assert nproc * (w + 1) <= max(cores, nproc)',
        quick=True,
    ),
    Mutant(
        'accumulation-missing-1-over-k',
        NB,
        'k accumulated micro-batches equal one big batch',
        FILE,
        old='loss = loss_fn(net(X), y) / k',
        new='loss = loss_fn(net(X), y)',
        catch="assert r['calls_no_sync'] == r['buckets']",
    ),
    Mutant(
        'accumulation-syncs-every-micro-batch',
        NB,
        'no_sync skips the allreduce of k-1 micro-batches',
        FILE,
        old='with contextlib.nullcontext() if last else net.no_sync():',
        new='with contextlib.nullcontext():',
        catch="assert r['calls_no_sync'] == r['buckets']",
    ),
    Mutant(
        'evaluation-counts-the-padding',
        NB,
        'distributed evaluation counts each sample once',
        FILE,
        old='keep = max(0, min(len(y), num_real - seen))',
        new='keep = len(y)',
        catch="assert (r['correct'], r['total']) == (r['single_correct'], r['n'])",
    ),
    Mutant(
        'no-underflow-to-show',
        NB,
        'float16 loses 1e-8 unless it is scaled first',
        FILE,
        old='tiny = torch.tensor(1e-8)',
        new='tiny = torch.tensor(1e-3)',
        catch='assert tiny.half().item() == 0 and (tiny * 2**16).half().item() > 0',
    ),
    Mutant(
        'sampler-drops-instead-of-padding',
        NB,
        'DistributedSampler pads with index 0',
        FILE,
        old='shards = [list(DistributedSampler(range(101), num_replicas=2, rank=r, shuffle=False))',
        new='shards = [list(DistributedSampler(range(101), num_replicas=2, rank=r, shuffle=False, drop_last=True))',
        catch='assert [len(s) for s in shards] == [51, 51]',
    ),
    Mutant(
        'shuffle-off-with-a-sampler',
        NB,
        'shuffle=True beside a sampler is refused',
        FILE,
        old='    DataLoader(dataset, batch_size=2, shuffle=True,',
        new='    DataLoader(dataset, batch_size=2, shuffle=False,',
        catch='assert shuffle_error is not None',
    ),
    Mutant(
        'bucket-view-not-asked-for',
        NB,
        'gradient_as_bucket_view puts the gradients in one bucket',
        FILE,
        old='grad_storages(gradient_as_bucket_view=True)\n',
        new='grad_storages()\n',
        catch='assert apart == 4 and views == 1',
    ),
]
