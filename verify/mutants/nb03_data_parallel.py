"""Planted bugs for notebook 3, nn.DataParallel from the inside out."""

from verify.mutants.registry import Mutant

NB = '03_data_parallel'
FILE = f'notebooks/{NB}.ipynb'

MUTANTS = [
    Mutant(
        'replicas-alias-on-cpu',
        NB,
        'every replica but the first holds copies',
        FILE,
        old='t.to(device, copy=True)',
        new='t.to(device)',
        catch="assert shared == (len(originals) if k == 0 else 0)",
        quick=True,
    ),
    Mutant(
        'replicas-detached',
        NB,
        "replicas' gradients flow back to the parameters",
        FILE,
        old='t.to(device, copy=True)',
        new='t.detach().to(device, copy=True)',
        catch='assert_close_on_cpu(p.grad, q.grad, **close, msg=name)',
    ),
    Mutant(
        'gather-ignores-dim',
        NB,
        'outputs are gathered along the scattered dim',
        FILE,
        old='return torch.cat([o.to(output_device) for o in outputs], dim)',
        new='return torch.cat([o.to(output_device) for o in outputs], 0)',
        catch='assert_close_on_cpu(got_out, expected_out, **close)',
    ),
    Mutant(
        'loss-mean-over-uneven-shards',
        NB,
        'uneven shards need a weighted mean',
        FILE,
        old='weighted = (per_device * sizes.to(per_device.device)).sum() / sizes.sum()',
        new='weighted = per_device.mean()',
        catch='assert_close_on_cpu(weighted, full)',
    ),
    Mutant(
        'prefix-stripped-everywhere',
        NB,
        "only a leading 'module.' is stripped",
        FILE,
        old='state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}',
        new="state_dict = {k.replace(prefix, ''): v for k, v in state_dict.items()}",
        catch='assert list(load_state_dict_flexible(Tagger(), tagger_state))',
    ),
    Mutant(
        'replicas-run-in-turns',
        NB,
        'the replicas run at the same time, one thread each',
        FILE,
        old='    for t in threads:\n        t.start()\n    for t in threads:\n        t.join()',
        new='    for t in threads:\n        t.start()\n        t.join()',
        catch='met = parallel_apply(replicate(MeetTheOthers(), devices)',  # the barrier times out: parallel_apply raises
    ),
    Mutant(
        'shards-out-of-order',
        NB,
        'the shards, put back together, are the batch',
        FILE,
        old='columns.append([part.to(device) for part, device in zip(parts, devices)])',
        new='columns.append([part.to(device) for part, device in zip(parts[::-1], devices)])',
        catch='assert_close_on_cpu(torch.cat(on_cpu([s for (s,) in shards])), X, rtol=0, atol=0)',
    ),
]

MUTANTS += [
    Mutant(
        'replicas-built-once',
        NB,
        'replicas are rebuilt at every forward pass (training equals one device)',
        FILE,
        old='        return data_parallel(self.module, inputs, self.devices, self.output_device, self.dim)',
        new="        if not hasattr(self, 'replicas'):  # replicated once: stale after the first step\n"
        "            self.replicas = replicate(self.module, self.devices)\n"
        "        outputs = parallel_apply(self.replicas, scatter_inputs(inputs, self.devices, self.dim))\n"
        "        return gather(outputs, self.output_device, self.dim)",
        catch='assert_close_on_cpu(torch.tensor(hand_losses), torch.tensor(single_losses), **tight)',
    ),
    Mutant(
        'misfits-by-name-only',
        NB,
        'a checkpoint is checked by names and shapes before loading',
        FILE,
        old='if k not in expected or k not in stripped or expected[k].shape != stripped[k].shape)',
        new='if k not in expected or k not in stripped)',
        catch="assert misfits == ['9.bias', '9.weight']",
    ),
    Mutant(
        'before-not-cloned',
        NB,
        'a failed load leaves the network half overwritten',
        FILE,
        old='before = {k: v.clone() for k, v in target.state_dict().items()}',
        new='before = dict(target.state_dict())',
        catch='assert changed  # the error came too late',
    ),
    Mutant(
        'ring-without-allgather',
        NB,
        'a ring allreduce sends 2(k-1) chunks of N/k each way',
        FILE,
        old='for step in range(2 * (k - 1)):',
        new='for step in range(k - 1):',
        catch='assert all(abs(r - 2 * 2 * (k - 1) / k * param_bytes) < 1e-9 * param_bytes for r in ring)',
    ),
    Mutant(
        'batchnorm-on-one-slot',
        NB,
        'shard-wise BatchNorm differs from one device',
        FILE,
        old='train_mode = HandDataParallel(bn_net, devices)(X)',
        new='train_mode = HandDataParallel(bn_net, devices[:1])(X)',
        catch='assert not torch.allclose(on_cpu(train_mode), on_cpu(bn_twin(X.to(devices[0]))))',
    ),
    Mutant(
        'wrapped-net-left-in-training',
        NB,
        'in eval mode DataParallel equals one device',
        FILE,
        old='bn_net.eval(), bn_twin.eval()',
        new='bn_twin.eval()',
        catch='assert_close_on_cpu(eval_mode, bn_twin(X.to(devices[0])), **exact)',
    ),
]

MUTANTS += [
    Mutant(
        'checkpoint-saved-unwrapped',
        NB,
        "a wrapped model's checkpoint loads nothing into a bare network with strict=False",
        FILE,
        old="wrapped_path = save_checkpoint(nn.DataParallel(trained).state_dict(), ckpt_dir / 'wrapped.pt')",
        new="wrapped_path = save_checkpoint(trained.state_dict(), ckpt_dir / 'wrapped.pt')",
        catch='assert len(result.missing_keys) == len(result.unexpected_keys) == len(state)',
    ),
]

# A check that only two GPUs can run: a NEEDS-GPU row on smaller machines, run by
# `make mutants MUTANTS_FLAGS=--gpu-only` on a machine with two.
MUTANTS += [
    Mutant(
        'batch-scattered-from-the-host',
        NB,
        'the output device fills up first: it holds the whole batch',
        FILE,
        old='X_big, y_big = batch_X.repeat(8, 1, 1, 1).to(gpus[0]), batch_y.repeat(8).to(gpus[0])',
        new='X_big, y_big = batch_X.repeat(8, 1, 1, 1), batch_y.repeat(8).to(gpus[0])',
        catch='assert peaks[0] - max(peaks[1:]) >= X_big.nbytes // 2',
        gpus=2,
    ),
]


# Per-check mutants (issue 33): each fails its named check first.
MUTANTS += [
    Mutant(
        'gru-split-over-one-slot',
        NB,
        'splitting a GRU along time (dim=0) changes its output',
        FILE,
        old='wrong_out, _ = HandDataParallel(gru, devices, dim=0)(seq)',
        new='wrong_out, _ = HandDataParallel(gru, devices[:1], dim=0)(seq)',
        catch='assert not torch.allclose(on_cpu(wrong_out), on_cpu(expected_out))',
    ),
    Mutant(
        'scalar-outputs-summed',
        NB,
        'a scalar per replica is gathered as one entry per device',
        FILE,
        old='return torch.stack([o.to(output_device) for o in outputs])',
        new='return sum(o.to(output_device) for o in outputs)',
        catch='assert per_device.shape == (4,)',
    ),
    Mutant(
        'loss-demo-batch-divides-evenly',
        NB,
        'the plain mean is off only because the shards are uneven',
        FILE,
        old='X10, y10 = torch.randn(10, 1, 28, 28), torch.randint(0, 10, (10,))',
        new='X10, y10 = torch.randn(12, 1, 28, 28), torch.randint(0, 10, (12,))',
        catch='assert not torch.isclose(on_cpu(per_device.mean()), on_cpu(full))',
    ),
    Mutant(
        'batchnorm-twin-not-copied',
        NB,
        "the wrapped network keeps replica 0's running statistics, not the batch's",
        FILE,
        old='bn_twin = copy.deepcopy(bn_net)',
        new='bn_twin = bn_net',
        catch='assert not torch.allclose(on_cpu(bn_net[1].running_mean), on_cpu(bn_twin[1].running_mean))',
    ),
]

# Checks that only GPUs can fail: on CPU slots every device is the CPU, so where the batch
# was and which slot is the output device make no difference.
MUTANTS += [
    Mutant(
        'batch-on-a-gpu-broadcast',
        NB,
        'the split does not depend on where the batch was',
        FILE,
        old='parts = arg.chunk(len(devices), dim)',
        new='parts = [arg] * len(devices) if arg.is_cuda else arg.chunk(len(devices), dim)',
        catch='assert shard.shape == other.shape',
        gpus=1,
    ),
    Mutant(
        'output-device-ignored',
        NB,
        'the output lands on output_device',
        FILE,
        old='self.output_device = devices[0] if output_device is None else output_device',
        new='self.output_device = devices[0]',
        catch='assert moved.device == target',
        gpus=2,
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = []
