"""Planted bugs of notebook 10 (ZeRO by hand), each tied to the check that must catch it."""

from verify.mutants.registry import Mutant

NB = '10_zero'
TARGET = 'notebooks/10_zero.ipynb'
LAUNCH = "run = d2lpar.launch(work / 'train_zero.py'"  # the script asserts parity
BYTES = "assert all(r['sent'][name] == zero_bytes_sent(stage, P, n) for r in report.values()), name"

MUTANTS = [
    Mutant(
        'stepmemory-misses-new-tensors',
        NB,
        'StepMemory counts 16 B per parameter after an AdamW step, and the peak above it',
        'd2lpar/helpers/memory.py',
        old="        for t in tree_flatten(out)[0]:\n            if isinstance(t, torch.Tensor):\n"
        "                self.add(t)\n",
        new="",
        catch="assert after == 16 * P + 4 * len(params)",
        quick=True,
    ),
    Mutant(
        'zero2-gradients-counted-whole',
        NB,
        'ZeRO-2 holds 1/N of the gradients',
        TARGET,
        old="'zero2': (1, n, n)",
        new="'zero2': (1, 1, n)",
        catch="assert model_state_bytes('zero2', P, N, **mixed) == (2 + 14 / N) * P",
        quick=True,
    ),
    Mutant(
        'shards-transposed',
        NB,
        'row r of the padded buffer is rank r\'s shard',
        TARGET,
        old="return nn.functional.pad(flat, (0, -flat.numel() % n)).view(n, -1)",
        new="return nn.functional.pad(flat, (0, -flat.numel() % n)).view(-1, n)",
        catch="assert rows.tolist() == [[0., 1., 2.], [3., 4., 0.]]",
        quick=True,
    ),
    Mutant(
        'zero1-stale-parameters',
        NB,
        'every stage trains as one process',
        TARGET,
        old="        self.gather_params()\n        self.reduced = set()",
        new="        self.reduced = set()  # forgot to all-gather: other ranks' rows stay stale",
        catch=LAUNCH,
    ),
    Mutant(
        'zero1-wrong-shard-updated',
        NB,
        'every stage trains as one process',
        TARGET,
        old="return self.flats[p][self.rank]",
        new="return self.flats[p][(self.rank + 1) % self.n]",
        catch=LAUNCH,
    ),
    Mutant(
        'zero1-mean-divided-twice',
        NB,
        'the shards hold the mean gradient (SGD sees a wrong scale)',
        TARGET,
        old="(rows[self.rank] / self.n).split(sizes)",
        new="(rows[self.rank] / self.n / self.n).split(sizes)",
        catch=LAUNCH,
    ),
    Mutant(
        'zero1-mean-not-divided',
        NB,
        'the shards hold the mean gradient (SGD sees a wrong scale)',
        TARGET,
        old="(rows[self.rank] / self.n).split(sizes)",
        new="rows[self.rank].split(sizes)",
        catch=LAUNCH,
    ),
    Mutant(
        'zero3-bytes-as-zero2',
        NB,
        'ZeRO-3 sends 3(N-1)/N Psi, the others 2(N-1)/N Psi',
        TARGET,
        old="passes = 3 if stage == 'zero3' else 2",
        new="passes = 2",
        catch=BYTES,
    ),
    Mutant(
        'zero2-full-gradients-kept',
        NB,
        'each stage lowers the peak (ZeRO-2 frees a bucket\'s full gradients)',
        TARGET,
        old="            p.grad = None  # in the bucket now: free the full gradient\n",
        new="",
        catch="assert formula[name] <= peaks[name] <= formula[name] + 5 * layer_bytes, name",
    ),
    # Caught by the bytes: a layer never freed after forward is not gathered again for backward,
    # so ZeRO-3 sends 2(N-1)/N Psi, not 3(N-1)/N Psi (its values stay right).
    Mutant(
        'zero3-not-freed-after-forward',
        NB,
        'ZeRO-3 frees each layer after its forward and gathers it again for backward',
        TARGET,
        old="            if p in self.flats:\n                self.flats[p].untyped_storage().resize_(0)",
        new="            pass  # forgot to free",
        catch=BYTES,
    ),
    Mutant(
        'adamw-foreach-temporaries',
        NB,
        'the peak lies a few layers above the formula, whatever the depth (AdamW\'s default on GPUs)',
        TARGET,
        old="weight_decay=0.01, foreach=False))}",
        new="weight_decay=0.01, foreach=True))}",
        catch="assert formula[name] <= peaks[name] <= formula[name] + 5 * layer_bytes, name",
    ),
]

MUTANTS += [
    Mutant(
        'script-edited-diff-stale',
        NB,
        "the next script's diff applies to the script as it stands, at the lines it names",
        TARGET,
        old='W, STEPS, TOL = args.width, 3, 1e-5',
        new='W, STEPS = args.width, 3\nTOL = 1e-5',
        catch="d2lpar.write_next(work / 'train_zero.py', work / 'measure_zero.py'",
    ),
    Mutant(
        'mixed-precision-without-the-master-copy',
        NB,
        "DDP holds 16 bytes per parameter in mixed precision (fp32 master copy and Adam's two states)",
        TARGET,
        old='mixed = dict(bytes_param=2, bytes_grad=2, bytes_state=12)',
        new='mixed = dict(bytes_param=2, bytes_grad=2, bytes_state=8)',
        catch="assert model_state_bytes('ddp', P, N, **mixed) == 16 * P",
    ),
    Mutant(
        'zero1-shards-the-gradients',
        NB,
        'ZeRO-1 shards the optimizer state only',
        TARGET,
        old="'zero1': (1, 1, n)",
        new="'zero1': (1, n, 1)",
        catch="assert model_state_bytes('zero1', P, N, **mixed) == (4 + 12 / N) * P",
    ),
    Mutant(
        'zero3-keeps-whole-parameters',
        NB,
        'ZeRO-3 shards the parameters too',
        TARGET,
        old="'zero3': (n, n, n)",
        new="'zero3': (1, n, n)",
        catch="assert model_state_bytes('zero3', P, N, **mixed) == 16 / N * P",
    ),
    Mutant(
        'peak-read-after-the-step',
        NB,
        'the peak of a step is above what it holds after (memory over the whole step, not after it)',
        'd2lpar/helpers/memory.py',
        old='        return max(b for _, b in self.timeline)',
        new='        return self.timeline[-1][1]',
        catch='assert mem.peak > after',
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = [
    # Each stage's peak is checked against its own formula band just before; a bug that moves
    # a peak within its band yet out of this order was not found.
    "assert peaks['DDP'] > peaks['ZeRO-1'] > peaks['ZeRO-2'] > peaks['ZeRO-3']",
]
