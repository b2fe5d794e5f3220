"""Planted bugs for notebook 3, nn.DataParallel from the inside out."""
from verify.mutants.registry import Mutant

NB = '03_data_parallel'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant('replicas-alias-on-cpu', NB, 'every replica but the first holds copies', FILE,
           old='t.to(device, copy=True)', new='t.to(device)',
           catch="assert shared == (len(originals) if k == 0 else 0)", quick=True),
    Mutant('replicas-detached', NB, "replicas' gradients flow back to the parameters", FILE,
           old='t.to(device, copy=True)', new='t.detach().to(device, copy=True)',
           catch='assert_close_on_cpu(p.grad, q.grad, **close, msg=name)'),
    Mutant('gather-ignores-dim', NB, 'outputs are gathered along the scattered dim', FILE,
           old='return torch.cat([o.to(output_device) for o in outputs], dim)',
           new='return torch.cat([o.to(output_device) for o in outputs], 0)',
           catch='assert_close_on_cpu(got_out, expected_out, **close)'),
    Mutant('loss-mean-over-uneven-shards', NB, 'uneven shards need a weighted mean', FILE,
           old='weighted = (per_device * sizes.to(per_device.device)).sum() / sizes.sum()',
           new='weighted = per_device.mean()', catch='assert_close_on_cpu(weighted, full)'),
    Mutant('prefix-stripped-everywhere', NB, "only a leading 'module.' is stripped", FILE,
           old='state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}',
           new="state_dict = {k.replace(prefix, ''): v for k, v in state_dict.items()}",
           catch='assert list(load_state_dict_flexible(Tagger(), tagger_state))'),
    Mutant('replicas-run-in-turns', NB, 'the replicas run at the same time, one thread each', FILE,
           old='    for t in threads:\n        t.start()\n    for t in threads:\n        t.join()',
           new='    for t in threads:\n        t.start()\n        t.join()',
           catch='assert barrier.broken is False'),
]
