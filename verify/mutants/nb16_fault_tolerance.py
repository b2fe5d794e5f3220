"""Planted bugs for notebook 16 (fault tolerance), each with the check that must catch it."""

from verify.mutants.registry import Mutant

NB = '16_fault_tolerance'
TARGET = 'notebooks/16_fault_tolerance.ipynb'

MUTANTS = [
    Mutant(
        name='nb16-behind-blames-everyone',
        notebook=NB,
        claim='the stuck rank is the one whose count is behind',
        target=TARGET,
        old='if count < newest)',
        new='if count <= newest)',
        catch="assert behind({0: 4, 1: 4, 2: 3}) == (4, [2])",
        quick=True,
    ),
    Mutant(
        name='nb16-young-without-2',
        notebook=NB,
        claim="Young's rule minimises the waste",
        target=TARGET,
        old='return math.sqrt(2 * checkpoint_cost * mtbf)',
        new='return math.sqrt(checkpoint_cost * mtbf)',
        catch='<= 1.005 * min(',
    ),
    Mutant(
        name='nb16-waste-forgets-restart',
        notebook=NB,
        claim='the expected waste agrees with the simulation',
        target=TARGET,
        old='segment_time = (mtbf + restart_cost) * math.expm1(',
        new='segment_time = mtbf * math.expm1(',
        catch='assert abs(s - e) <= 4 / math.sqrt(num_failures) * e',
    ),
    Mutant(
        name='nb16-timeout-not-changed',
        notebook=NB,
        claim='the timeout can be changed at run time',
        target=TARGET,
        old='steps.set_timeout(args.timeout)',
        new='pass  # steps.set_timeout(args.timeout)',
        catch="2 <= seen['waited'] < 30",
    ),
    Mutant(
        name='nb16-replica-never-killed',
        notebook=NB,
        claim='a replica is really killed mid-step and the survivor sees it',
        target=TARGET,
        old='replica == 1 and attempt == 0 and step == args.kill_at',
        new='replica == 1 and attempt == 0 and step == -1',
        catch="survivor, spare = logs[0, 0], logs[1, 1]",
    ),
    Mutant(
        name='nb16-heal-without-optimizer',
        notebook=NB,
        claim='a healed replica holds exactly the peers\' weights and momentum',
        target=TARGET,
        old="load_state_dict=lambda s: (net.load_state_dict(s['net']), opt.load_state_dict(s['opt'])),",
        new="load_state_dict=lambda s: net.load_state_dict(s['net']),",
        catch="assert len({e['weights'] for _, e in entries}) == 1",
    ),
    Mutant(
        name='nb16-replay-wrong-scale',
        notebook=NB,
        claim='the run equals one process with the same quorum sizes, bit for bit',
        target=TARGET,
        old='p.grad = sum(grads) / n  # the all-reduce',
        new='p.grad = sum(grads) / 2  # the all-reduce',
        catch='assert losses_ft == losses_replay',
    ),
    Mutant(
        name='nb16-checker-accepts-sqrt-cm',
        notebook=NB,
        claim='the exercise checker rejects sqrt(C*M)',
        target='d2lpar/exercises/fault_tolerance.py',
        old='SLACK = 1.01',
        new='SLACK = 1.10',
        catch='tests/exercises/test_fault_tolerance.py::test_wrong_checkpoint_intervals_fail',
        run='tests/exercises/test_fault_tolerance.py::test_wrong_checkpoint_intervals_fail',
        quick=True,
    ),
    Mutant(
        name='nb16-diloco-syncs-every-step',
        notebook=NB,
        claim='DiLoCo sends H times fewer bytes than data parallelism (counted)',
        target=TARGET,
        old='if H is not None and (step + 1) % H == 0:  # DiLoCo',
        new='if H is not None:  # DiLoCo',
        catch="assert ddp['messages'] == diloco_steps",
    ),
    Mutant(
        name='nb16-outer-step-forgets-start',
        notebook=NB,
        claim='with H=1 and outer SGD lr=1, DiLoCo is data parallelism up to rounding',
        target=TARGET,
        old='p.copy_(p0)  # back to the shared start',
        new='pass  # back to the shared start',
        catch="assert (w_ddp - w_ref).abs().max() <= diloco_steps",
    ),
    Mutant(
        name='nb16-outer-step-forgets-start-lib',
        notebook=NB,
        claim='the outer step is Nesterov SGD from the start on the outer gradient',
        target='d2lpar/lessons/nb16_fault_tolerance.py',
        old='p.copy_(p0)  # back to the shared start',
        new='pass  # back to the shared start',
        catch='tests/test_fault_tolerance.py::test_outer_step_is_nesterov_sgd_on_the_outer_gradient',
        run='tests/test_fault_tolerance.py::test_outer_step_is_nesterov_sgd_on_the_outer_gradient',
        quick=True,
    ),
    Mutant(
        name='nb16-link-not-slowed',
        notebook=NB,
        claim='every message over the slow link waits the delay',
        target=TARGET,
        old='time.sleep(delay)  # the slow link',
        new='pass  # the slow link',
        catch="assert slow['wall'] >= slow['messages'] * link_delay",
    ),
    Mutant(
        name='nb16-outer-lr-too-small',
        notebook=NB,
        claim="DiLoCo's loss after S steps is below data parallelism's after S/2",
        target=TARGET,
        old='def train(H=None, outer_lr=0.7,',
        new='def train(H=None, outer_lr=0.07,',
        catch='assert final < half',
    ),
    Mutant(
        name='nb16-watchdog-never-started',
        notebook=NB,
        claim='a watchdog gives up on a hung group long before its timeout',
        target=TARGET,
        old='threading.Thread(target=watchdog, args=(args.watchdog,), daemon=True).start()',
        new='threading.Thread(target=watchdog, args=(args.watchdog,), daemon=True)',
        catch="assert seen['what'] == 'gave up' and seen['missing'] == [2] and seen['waited'] < 30",
    ),
    Mutant(
        name='nb16-watchdog-reads-progress-once',
        notebook=NB,
        claim='the watchdog names the stuck rank from the counters it watches',
        target=TARGET,
        old='    last, since = None, time.monotonic()\n    while True:\n        now, seen = time.monotonic(), progress()\n',
        new='    last, since, seen = None, time.monotonic(), progress()\n    while True:\n        now = time.monotonic()\n',
        catch="assert seen['what'] == 'gave up' and seen['missing'] == [2] and seen['waited'] < 30",
    ),
    Mutant(
        name='nb16-grads-of-the-sum',
        notebook=NB,
        claim='the run with the failure equals the run without, up to rounding (the step does not depend on the quorum)',
        target=TARGET,
        old='F.mse_loss(net(X), y).backward()',
        new="F.mse_loss(net(X), y, reduction='sum').backward()",
        catch='assert all(g <= len(sizes) * batch * eps * max(losses_whole) for g in gap)',
    ),
    Mutant(
        name='nb16-kill-does-not-kill',
        notebook=NB,
        claim='the peers of a killed rank get an error at once, not after the timeout',
        target=TARGET,
        old="os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would",
        new="pass  # as the kernel's OOM killer would",
        catch="killed[rank]['time'] - killed[2]['time'] < 10",
    ),
    Mutant(
        name='nb16-commits-regardless',
        notebook=NB,
        claim='the survivor does not commit the step its peer died in',
        target=TARGET,
        old='committed = manager.should_commit()  # False if any replica failed this step',
        new='manager.should_commit(); committed = True  # False if any replica failed this step',
        catch="assert [e['step'] for e in failed] == [5]",
    ),
    Mutant(
        name='nb16-quorum-needs-everyone',
        notebook=NB,
        claim='the survivor retries the step alone, in a quorum of one',
        target=TARGET,
        old='LighthouseServer(bind=\'127.0.0.1:0\', min_replicas=1,',
        new='LighthouseServer(bind=\'127.0.0.1:0\', min_replicas=2,',
        catch="assert [e['quorum'] for e in survivor if e['step'] == 5] == [2, 1]",
    ),
    Mutant(
        name='nb16-healed-read-after-quorum',
        notebook=NB,
        claim='the spare is healed from a peer and joins the quorum',
        target=TARGET,
        old=(
            '    begin, before = time.time(), manager.current_step()\n'
            '    manager.start_quorum()  # may heal this replica: weights, optimizer and step from a peer\n'
        ),
        new=(
            '    begin = time.time()\n'
            '    manager.start_quorum()  # may heal this replica: weights, optimizer and step from a peer\n'
            '    before = manager.current_step()\n'
        ),
        catch="assert spare[0]['healed'] and spare[0]['step'] > 5",
    ),
    Mutant(
        name='nb16-one-step-short',
        notebook=NB,
        claim='every step up to --steps is committed, none skipped',
        target=TARGET,
        old='while manager.current_step() < args.steps or',
        new='while manager.current_step() + 1 < args.steps or',
        catch='assert steps_done == list(range(len(steps_done)))',
    ),
    Mutant(
        name='nb16-loss-of-own-shard',
        notebook=NB,
        claim="every replica of a quorum commits the step and reports the job's loss",
        target=TARGET,
        old='loss = steps.full_loss(net, X, y)',
        new='loss = steps.full_loss(net, *steps.shard(X, y, r, n))',
        catch="assert len(entries) == entries[0][1]['quorum']",
    ),
    Mutant(
        name='nb16-one-clock-for-all-runs',
        notebook=NB,
        claim='DiLoCo over the slow link takes less time than one message per step would',
        target=TARGET,
        old='    begin = time.perf_counter()\n    for step in range(args.steps):',
        new=(
            "    begin = train.__dict__.setdefault('begin', time.perf_counter())  # one clock for all runs\n"
            '    for step in range(args.steps):'
        ),
        catch="assert diloco['wall'] < diloco_steps * link_delay",
    ),
]


# Checks no mutant names yet: each needs a mutant whose `catch` is in its text (then it leaves
# this list), or the check goes (`run.py --unnamed` lists them).
UNNAMED_CHECKS = []
