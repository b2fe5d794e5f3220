"""d2lpar.ddp_practice against single-process PyTorch: accumulation, join, evaluation, workers."""

import os

import pytest
import torch
import torch.distributed as dist
from spawned import run_ranks
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from d2lpar import ddp_practice
from d2lpar.distributed import count_calls
from d2lpar.helpers import probes  # where inductor_works looks up cxx_compiler

WORLD, K, MICRO, LR = 2, 3, 4, 0.1


def make_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))


def data(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def flat(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def big_batch_reference():
    """One SGD step of one process on the global batch (all ranks' micro-batches)."""
    X, y = data(WORLD * K * MICRO)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    nn.functional.cross_entropy(net(X), y).backward()
    opt.step()
    return flat(net)


def join_reference(counts, batch=5):
    """SGD where ranks without a batch contribute zero and the mean divides by the world size."""
    X, y = data(batch * sum(counts), seed=2)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    shards, start = [], 0
    for c in counts:
        shards.append(
            [
                (X[start + i * batch : start + (i + 1) * batch], y[start + i * batch : start + (i + 1) * batch])
                for i in range(c)
            ]
        )
        start += c * batch
    for t in range(max(counts)):
        opt.zero_grad()
        for r, c in enumerate(counts):
            if t < c:
                (nn.functional.cross_entropy(net(shards[r][t][0]), shards[r][t][1]) / len(counts)).backward()
        opt.step()
    return flat(net), shards


def worker(rank, world_size):
    out = {}
    X, y = data(WORLD * K * MICRO)
    lo = rank * K * MICRO
    mine = [(X[lo + i : lo + i + MICRO], y[lo + i : lo + i + MICRO]) for i in range(0, K * MICRO, MICRO)]
    calls = {}
    for name, sync_every in (('no_sync', False), ('every', True)):
        net = DDP(make_net(), bucket_cap_mb=0.0005)  # about 500 B: several buckets
        net.register_comm_hook(None, default_hooks.allreduce_hook)
        nn.functional.cross_entropy(net(X[:2]), y[:2]).backward()  # buckets are set now
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        with count_calls(('all_reduce',)) as counted:
            if sync_every:
                opt.zero_grad()
                for Xm, ym in mine:
                    (nn.functional.cross_entropy(net(Xm), ym) / K).backward()
                opt.step()
            else:
                ddp_practice.accumulate_step(net, opt, mine, nn.functional.cross_entropy)
        calls[name] = counted['all_reduce']['calls']
        out[name] = flat(net.module).tolist()
    with count_calls(('all_reduce',)) as counted:
        nn.functional.cross_entropy(net(X[:2]), y[:2]).backward()
    calls['one_backward'] = counted['all_reduce']['calls']
    out['calls'] = calls

    counts = [2, 4]
    _, shards = join_reference(counts)
    net = DDP(make_net())
    steps = ddp_practice.train_uneven(
        net, torch.optim.SGD(net.parameters(), lr=LR), shards[rank], nn.functional.cross_entropy
    )
    out['join'] = (steps, flat(net.module).tolist())

    evaluations = {}
    for n in (7, 1, 8):  # 1 pad, rank 1 all padding, no padding
        Xe, ye = data(n, seed=3)
        evaluated = make_net().train()
        evaluations[n] = ddp_practice.evaluate_distributed(evaluated, torch.utils.data.TensorDataset(Xe, ye), 3)
        assert evaluated.training  # back in the mode it came in
    out['evaluate'] = evaluations
    return out


@pytest.fixture(scope='module')
def ranks():
    return run_ranks(worker, WORLD)


def test_accumulation_equals_one_step_on_the_global_batch(ranks):
    want = big_batch_reference()
    for rank in range(WORLD):
        for name in ('no_sync', 'every'):
            torch.testing.assert_close(torch.tensor(ranks[rank][name]), want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(want, flat(make_net()))  # the step moved the parameters


def test_no_sync_allreduces_each_bucket_once_instead_of_k_times(ranks):
    for rank in range(WORLD):
        calls = ranks[rank]['calls']
        buckets = calls['one_backward']
        assert buckets >= 2  # the small bucket cap made several buckets
        assert calls['no_sync'] == buckets and calls['every'] == K * buckets


def test_join_finishes_uneven_ranks_with_the_expected_update(ranks):
    want, _ = join_reference([2, 4])
    assert [ranks[r]['join'][0] for r in range(WORLD)] == [2, 4]
    for rank in range(WORLD):
        torch.testing.assert_close(torch.tensor(ranks[rank]['join'][1]), want, rtol=1e-5, atol=1e-6)


def test_distributed_evaluation_counts_each_sample_once(ranks):
    net = make_net()
    for n in (7, 1, 8):
        X, y = data(n, seed=3)
        with torch.no_grad():
            correct = (net(X).argmax(1) == y).sum().item()
        for rank in range(WORLD):
            assert tuple(ranks[rank]['evaluate'][n]) == (correct, n)


def test_amp_step_stays_close_to_float32():
    X, y = data(16)
    net32, net16 = make_net(), make_net()
    loss32 = nn.functional.cross_entropy(net32(X), y)
    loss16 = ddp_practice.amp_step(net16, torch.optim.SGD(net16.parameters(), lr=LR), X, y, nn.functional.cross_entropy)
    assert loss16.dtype == torch.float32
    assert abs(loss16.item() - loss32.item()) < 1e-2 * abs(loss32.item())
    assert all(p.dtype == torch.float32 for p in net16.parameters())
    assert not torch.equal(flat(net16), flat(make_net()))  # it stepped


def test_loader_workers_fit_the_cores():
    # W ranks with w workers each are W x (w + 1) processes: they must fit the cores
    for nproc, cores in [(2, 2), (4, 2), (3, 8), (1, 1), (8, 128), (2, 16)]:
        w = ddp_practice.loader_workers(nproc, cores=cores)
        assert nproc * (w + 1) <= max(cores, nproc) and w >= 0
        assert w == 0 or nproc * (w + 2) > cores  # and no fewer than fit
    assert ddp_practice.loader_workers(2, cores=2) == 0
    assert ddp_practice.loader_workers(3, cores=8) == 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
    assert ddp_practice.loader_workers(1) == usable - 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match='loader_workers: nproc_per_node'):
            ddp_practice.loader_workers(bad)


def test_counting_backend_sees_the_graph_and_compiles_it():
    import torch._dynamo

    graphs = []
    torch._dynamo.reset()
    try:
        net = make_net()
        compiled = torch.compile(net, backend=ddp_practice.counting_backend(graphs, 'eager'))
        X, _ = data(4)
        torch.testing.assert_close(compiled(X), net(X))
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1 and isinstance(graphs[0], torch.fx.GraphModule)


def test_cxx_compiler_is_found_on_the_path_or_none(monkeypatch, tmp_path):
    monkeypatch.setenv('PATH', str(tmp_path))
    monkeypatch.delenv('CXX', raising=False)
    assert ddp_practice.cxx_compiler() is None
    fake = tmp_path / 'g++'
    fake.write_text('#!/bin/sh\n')
    fake.chmod(0o755)
    assert ddp_practice.cxx_compiler() == str(fake)


def test_overlap_report_reads_launches_before_the_last_gradient():
    intervals = [
        ('step 0', 0, 100, 1),
        ('backward', 10, 99, 1),
        ('autograd::engine::evaluate_function: A', 12, 20, 1),
        ('c10d::allreduce_', 21, 22, 1),
        ('gloo:all_reduce', 22, 40, 7),
        ('autograd::engine::evaluate_function: B', 30, 50, 1),
    ]
    (step,) = ddp_practice.overlap_report(intervals)
    assert step['first_launch'] == 21 and step['last_grad_start'] == 30
    assert step['grads_end'] == 50 and step['work_overlap_us'] == 18 and step['allreduces'] == 1


def test_bad_arguments_are_named():
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    with pytest.raises(TypeError, match='accumulate_step: net must be a DistributedDataParallel'):
        ddp_practice.accumulate_step(net, opt, [data(2)], nn.functional.cross_entropy)

    class Syncless(nn.Module):  # has no_sync, so only the batches are wrong
        def no_sync(self):
            raise AssertionError

    with pytest.raises(ValueError, match='accumulate_step: micro_batches is empty'):
        ddp_practice.accumulate_step(Syncless(), opt, [], nn.functional.cross_entropy)
    with pytest.raises(TypeError, match='accumulate_step: each micro-batch'):
        ddp_practice.accumulate_step(Syncless(), opt, [torch.ones(2)], nn.functional.cross_entropy)
    with pytest.raises(
        ValueError,
        match=r'accumulate_step: micro-batches must have equal '
        r'sizes, got \[3, 4\]',
    ):
        ddp_practice.accumulate_step(Syncless(), opt, [data(3), data(4)], nn.functional.cross_entropy)
    with pytest.raises(TypeError, match='train_uneven: net must be'):
        ddp_practice.train_uneven(net, opt, [], nn.functional.cross_entropy)
    with pytest.raises(RuntimeError, match='evaluate_distributed: no process group'):
        ddp_practice.evaluate_distributed(net, torch.utils.data.TensorDataset(*data(3)), 2)


def test_evaluate_distributed_names_a_dataset_without_length(monkeypatch):
    monkeypatch.setattr(dist, 'is_initialized', lambda: True)  # only the dataset is wrong
    monkeypatch.setattr(dist, 'get_world_size', lambda group=None: 2)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([])

    with pytest.raises(TypeError, match='evaluate_distributed: the dataset must have a length'):
        ddp_practice.evaluate_distributed(make_net(), Stream(), 2)


def test_profile_intervals_keeps_the_named_events_in_time_order(tmp_path):
    from torch.profiler import ProfilerActivity, profile, record_function

    net = make_net()
    X, y = data(8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function('step 0'):
            loss = nn.functional.cross_entropy(net(X), y)
            with record_function('backward'):
                loss.backward()
    intervals = ddp_practice.profile_intervals(prof)
    names = [e[0] for e in intervals]
    assert names[0] == 'step 0' and 'backward' in names
    assert any(n.startswith('autograd::engine::evaluate_function') for n in names)
    assert not any(n.startswith('aten::') for n in names)  # only the names asked for
    assert [e[1] for e in intervals] == sorted(e[1] for e in intervals)
    assert all(start <= end for _, start, end, _ in intervals)
    # no allreduce in one process: the report skips the step rather than invent one
    assert ddp_practice.overlap_report(intervals) == []
    png = tmp_path / 'timeline.png'
    ddp_practice.plot_comm_timeline(intervals, png)
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_the_script_opens_with_its_command_and_ends_with_exit_now():
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / 'notebooks' / 'scripts' / 'ddp_practice.py'
    text = script.read_text()
    run = [line for line in text.splitlines()[:4] if line.startswith('Run:  ')]
    assert run and 'torchrun' in run[0] and 'scripts/ddp_practice.py' in run[0]
    assert '\n    exit_now()' in text  # DDP's gloo threads would abort a normal teardown


class FakeProfile:
    """Stands for a profile taken with ProfilerActivity.CUDA: real FunctionEvents."""

    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def test_profile_intervals_drops_the_gpu_copies_of_each_range():
    # issue 24, defect 1: with ProfilerActivity.CUDA each record_function range comes back
    # twice, once as a gpu_user_annotation (device_type CUDA) of the same name.
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    events = []
    for i, (name, start, end) in enumerate([('step 0', 0, 100), ('backward', 10, 90), ('nccl:all_reduce', 30, 60)]):
        events.append(FunctionEvent(2 * i, name, thread=1, start_us=start, end_us=end))
        events.append(
            FunctionEvent(2 * i + 1, name, thread=7, start_us=start + 1, end_us=end + 1, device_type=DeviceType.CUDA)
        )
    intervals = ddp_practice.profile_intervals(FakeProfile(events))
    assert [e[0] for e in intervals] == ['step 0', 'backward', 'nccl:all_reduce']
    assert [e[3] for e in intervals] == [1, 1, 1]  # the CPU ones


def test_loader_pins_only_where_the_dataloader_really_pins(monkeypatch):
    # issue 24, defect 3: on Apple's MPS the DataLoader turns pin_memory off with a warning
    import warnings

    from torch.utils.data import DataLoader, TensorDataset

    assert ddp_practice.loader_pins() == torch.accelerator.is_available()  # no MPS here
    monkeypatch.setattr(torch.accelerator, 'is_available', lambda: True)
    monkeypatch.setattr(torch.accelerator, 'current_accelerator', lambda *a, **k: torch.device('mps'))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter('always')
        (X,) = next(iter(DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2, pin_memory=True)))
    assert not X.is_pinned() and ddp_practice.loader_pins() is False  # torch's own answer too
    monkeypatch.setattr(torch.accelerator, 'current_accelerator', lambda *a, **k: torch.device('cuda'))
    assert ddp_practice.loader_pins() is True


def test_bf16_in_hardware_says_no_for_a_t4(monkeypatch):
    # issue 24, defect 8: is_bf16_supported() is True on a T4 (compute capability 7.5) because
    # it can emulate bfloat16; only including_emulation=False asks for the hardware.
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 0)
    monkeypatch.setattr(torch.cuda, '_check_bf16_tensor_supported', lambda device: True)
    monkeypatch.setattr(torch.version, 'hip', None)
    for major, native in ((7, False), (8, True), (9, True)):
        monkeypatch.setattr(
            torch.cuda, 'get_device_properties', lambda device, major=major: SimpleNamespace(major=major, minor=5)
        )
        assert torch.cuda.is_bf16_supported()  # what the course used to trust
        assert ddp_practice.bf16_in_hardware() is native
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert ddp_practice.bf16_in_hardware() is False


def test_inductor_works_reports_a_missing_compiler_or_header(monkeypatch, tmp_path):
    # issue 24, defect 4: inductor also needs omp.h on macOS; the guard must see any failure.
    monkeypatch.setattr(probes, 'cxx_compiler', lambda: None)
    ok, why = ddp_practice.inductor_works()
    assert not ok and 'C++ compiler' in why
    monkeypatch.undo()
    # What the probe process prints when Apple's clang lacks libomp (run for real, this
    # takes half a minute: inductor compiles a kernel in a fresh process)
    import subprocess

    said = (
        "torch._inductor.exc.InductorError: CppCompileError: C++ compile error\n"
        "/tmp/x/cpp_prefix.h:5:10: fatal error: 'omp.h' file not found\n"
        "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace\n"
    )
    seen = {}

    def fake_run(argv, **kwargs):
        seen.update(kwargs['env'])
        return subprocess.CompletedProcess(argv, 1, '', said)

    monkeypatch.setattr(probes, 'cxx_compiler', lambda: '/usr/bin/clang++')
    monkeypatch.setattr(probes.subprocess, 'run', fake_run)
    ok, why = ddp_practice.inductor_works()
    assert not ok and why == "/tmp/x/cpp_prefix.h:5:10: fatal error: 'omp.h' file not found"
    assert seen['TORCHINDUCTOR_CACHE_DIR']  # a fresh cache: a cached kernel would hide it
    monkeypatch.setattr(
        probes.subprocess, 'run', lambda argv, **kw: subprocess.CompletedProcess(argv, 0, 'inductor works\n', '')
    )
    assert ddp_practice.inductor_works() == (True, '')


def test_on_nccl_the_allreduce_work_is_the_gpu_kernel_not_the_cpu_launch():
    # issue 34: on NCCL the CPU's nccl:all_reduce range only launches the kernel; the
    # all-reduce runs on the GPU, possibly after the step's CPU range has ended.
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    cpu = [
        ('step 0', 0, 100),
        ('autograd::engine::evaluate_function: A', 10, 20),
        ('c10d::allreduce_', 21, 22),
        ('nccl:all_reduce', 22, 23),
        ('autograd::engine::evaluate_function: B', 30, 50),
        ('step 1', 200, 300),
    ]
    events = [FunctionEvent(i, name, thread=1, start_us=a, end_us=b) for i, (name, a, b) in enumerate(cpu)]
    events.append(
        FunctionEvent(
            10,
            'ncclDevKernel_AllReduce_Sum_f32_RING_LL',
            thread=7,
            start_us=40,
            end_us=140,
            device_type=DeviceType.CUDA,
        )
    )
    events.append(
        FunctionEvent(11, 'volta_sgemm_128x64_nn', thread=7, start_us=30, end_us=45, device_type=DeviceType.CUDA)
    )  # not NCCL: left out
    intervals = ddp_practice.profile_intervals(FakeProfile(events))
    assert ('nccl kernel', 40, 140, 7) in intervals
    assert not any(e[0].startswith('volta') for e in intervals)
    (step,) = ddp_practice.overlap_report(intervals)  # step 1 has no gradients: skipped
    assert step['work_overlap_us'] == 10  # the kernel (40-140) during the gradients (until 50)
    assert step['first_launch'] == 21 and step['allreduces'] == 1
