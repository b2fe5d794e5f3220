"""What real DDP jobs need, checked on real ranks: accumulation, mixed precision, join, evaluation.

Run:  torchrun --standalone --nproc-per-node=2 scripts/ddp_practice.py --parts all --trace-dir /tmp/traces

Each part trains or evaluates the same small MLP on the same synthetic data as every
rank's reference (computed in one process on the whole batch) and hands back what it
measured with emit_result: one result per part, {'part': name, ...}. The last part,
compile, runs torch.compile on the DDP model (`--compile-backend inductor` needs a C++
compiler, and OpenMP on macOS). `--backend nccl` runs every part on one GPU per rank.

The algorithms (accumulate_step, amp_step, ...) are notebook 7's #@save cells: launched
from the notebook, `practice_steps` is the module d2lpar.save_cells wrote from them (its
folder on PYTHONPATH), so an edit to a cell takes effect here; run by hand, the package
holds the same code.
"""
import argparse
import datetime
import os
import statistics
import time

os.environ.setdefault('KINETO_LOG_LEVEL', '5')  # the profiler's GPU probe on CPU-only machines

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from d2lpar.ddp_practice import overlap_report, profile_intervals
from d2lpar.distributed import (BACKENDS, count_calls, default_timeout, dist_env, emit_result,
                                exit_now, pick_backend, rank_device)
from practice_common import MLP, ddp, flat, flat_grad, make_data, make_net, max_diff

try:  # notebook 7's cells, as the notebook last ran them
    from practice_steps import (accumulate_step, amp_step, counting_backend,
                                evaluate_distributed, loader_workers, train_uneven)
except ModuleNotFoundError:  # run by hand: the package's copy of the same cells
    from d2lpar.ddp_practice import (accumulate_step, amp_step, counting_backend,
                                     evaluate_distributed, loader_workers, train_uneven)

PARTS = ('accumulate', 'amp', 'join', 'evaluate', 'profile', 'loader', 'compile')


# ------------------------------------------------------------------ parts

def part_accumulate(rank, world, device, k=4, micro=4, lr=0.1):
    """k micro-batches with no_sync == one step on the whole batch; allreduces counted."""
    loss_fn = nn.CrossEntropyLoss()
    X, y = make_data(world * k * micro)
    # rank r's micro-batches; all ranks' micro-batches together are the global batch
    mine = [(X[i:i + micro].to(device), y[i:i + micro].to(device))
            for i in range(rank * k * micro, (rank + 1) * k * micro, micro)]
    reference = make_net()  # one process, one step on the concatenated global batch
    opt = torch.optim.SGD(reference.parameters(), lr=lr)
    loss_fn(reference(X), y).backward()
    opt.step()

    def run(step):
        net = ddp(make_net(), device, bucket_cap_mb=0.004)  # ~4 KB buckets: several of them
        net.register_comm_hook(None, default_hooks.allreduce_hook)  # Python: count_calls sees it
        loss_fn(net(mine[0][0]), mine[0][1]).backward()  # DDP sets its buckets after one pass
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        with count_calls(('all_reduce',)) as calls:
            step(net, opt)
        return flat(net.module), calls['all_reduce']['calls']

    def big_batch(net, opt):  # one DDP step on this rank's k * micro samples at once
        opt.zero_grad()
        loss_fn(net(torch.cat([b[0] for b in mine])), torch.cat([b[1] for b in mine])).backward()
        opt.step()

    def sync_every(net, opt):  # the same arithmetic without no_sync: k allreduces per bucket
        opt.zero_grad()
        for Xm, ym in mine:
            (loss_fn(net(Xm), ym) / k).backward()
        opt.step()

    big, buckets = run(big_batch)
    accumulated, calls_no_sync = run(lambda net, opt: accumulate_step(net, opt, mine, loss_fn))
    every, calls_every = run(sync_every)
    emit_result(part='accumulate', k=k, micro=micro, buckets=buckets,
                calls_no_sync=calls_no_sync, calls_every=calls_every,
                diff_vs_reference=max_diff(accumulated, flat(reference)),
                diff_vs_big_batch=max_diff(accumulated, big),
                diff_every_vs_reference=max_diff(every, flat(reference)),
                moved=max_diff(flat(reference), flat(make_net())))


def part_amp(rank, world, device, steps=20, batch=16, lr=0.1):
    """Autocast vs float32 on one batch; compressed vs plain allreduce over a short training."""
    loss_fn = nn.CrossEntropyLoss()
    on_gpu = device.type == 'cuda'
    low = torch.float16 if on_gpu else torch.bfloat16
    X, y = make_data(world * batch * steps, seed=2)
    X, y = X.to(device), y.to(device)
    net = make_net().to(device)
    loss32 = loss_fn(net(X[:batch]), y[:batch])
    loss32.backward()
    grad32 = flat_grad(net)
    net.zero_grad()
    with torch.autocast(device.type, dtype=low):
        out = net(X[:batch])
        loss16 = loss_fn(out, y[:batch])
    loss16.backward()
    grad16 = flat_grad(net)
    report = dict(part='amp', dtype=str(low), out_dtype=str(out.dtype),
                  loss_dtype=str(loss16.dtype), grad_dtype=str(next(net.parameters()).grad.dtype),
                  loss32=loss32.item(), loss16=loss16.item(),
                  grad_rel_err=((grad16 - grad32).norm() / grad32.norm()).item())

    def train(hook, autocast):
        net = ddp(make_net(), device)
        if hook is not None:
            net.register_comm_hook(None, hook)
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        scaler = torch.amp.GradScaler('cuda') if autocast and on_gpu else None
        losses = []
        with count_calls(('all_reduce',)) as calls:
            for s in range(steps):
                lo = (s * world + rank) * batch
                Xb, yb = X[lo:lo + batch], y[lo:lo + batch]
                if autocast:
                    losses.append(amp_step(net, opt, Xb, yb, loss_fn, scaler).item())
                else:
                    opt.zero_grad()
                    loss = loss_fn(net(Xb), yb)
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
        return flat(net.module), calls['all_reduce'], losses

    compress = default_hooks.fp16_compress_hook if on_gpu else default_hooks.bf16_compress_hook
    plain, plain_calls, plain_losses = train(default_hooks.allreduce_hook, autocast=False)
    packed, packed_calls, packed_losses = train(compress, autocast=False)
    mixed, mixed_calls, mixed_losses = train(compress, autocast=True)
    report.update(hook=compress.__name__, steps=steps, plain_bytes=plain_calls['bytes'],
                  compressed_bytes=packed_calls['bytes'], calls=plain_calls['calls'],
                  compressed_calls=packed_calls['calls'],
                  params=sum(p.numel() for p in net.parameters()),
                  diff_compressed=max_diff(packed, plain), diff_mixed=max_diff(mixed, plain),
                  moved=max_diff(plain, flat(make_net())), plain_losses=plain_losses,
                  compressed_losses=packed_losses, mixed_losses=mixed_losses)
    emit_result(report)


def part_join(rank, world, device, batch=8, lr=0.1, hang_seconds=2.0):
    """Rank r has 3 + 2r batches: join() lets every rank finish; the result is the math's."""
    loss_fn = nn.CrossEntropyLoss()
    counts = [3 + 2 * r for r in range(world)]
    X, y = make_data(batch * sum(counts), seed=3)
    starts = [batch * sum(counts[:r]) for r in range(world)]
    shards = [[(X[s + i * batch:s + (i + 1) * batch], y[s + i * batch:s + (i + 1) * batch])
               for i in range(counts[r])] for r, s in enumerate(starts)]
    net = ddp(make_net(), device)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    start = time.monotonic()
    steps = train_uneven(net, opt, [(a.to(device), b.to(device)) for a, b in shards[rank]],
                         loss_fn)
    seconds = time.monotonic() - start
    # The math: at step t the ranks that still have a batch contribute their gradient, the
    # joined ones zero, and DDP divides by the world size (divide_by_initial_world_size).
    reference = make_net()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    for t in range(max(counts)):
        ref_opt.zero_grad()
        for r in range(world):
            if t < counts[r]:
                (loss_fn(reference(shards[r][t][0]), shards[r][t][1]) / world).backward()
        ref_opt.step()
    report = dict(part='join', counts=counts, steps=steps, seconds=seconds,
                  diff=max_diff(flat(net.module), flat(reference)),
                  moved=max_diff(flat(reference), flat(make_net())))
    # Without join: the rank with more batches waits in an allreduce no one else joins. On a
    # group of its own with a short timeout it fails after hang_seconds instead of hanging.
    # The barrier first: a rank that arrives late must not time out DDP's constructor instead.
    dist.barrier()
    group = dist.new_group(backend='gloo', timeout=datetime.timedelta(seconds=hang_seconds))
    cpu_net = DDP(make_net(), process_group=group)
    cpu_opt = torch.optim.SGD(cpu_net.parameters(), lr=lr)
    error, waited = None, 0.0
    for t, (Xb, yb) in enumerate(shards[rank]):
        cpu_opt.zero_grad()
        start = time.monotonic()
        try:
            loss_fn(cpu_net(Xb), yb).backward()
        except RuntimeError as e:
            error, waited = str(e).splitlines()[0][:200], time.monotonic() - start
            break
        cpu_opt.step()
    report.update(no_join_error=error, no_join_waited=waited)
    dist.barrier()  # the world group is fine: every rank gets here
    emit_result(report)
    return net.module


def part_evaluate(rank, world, device, net, n=101, batch_size=16):
    """Accuracy sharded over ranks: padded duplicates not counted, then (wrongly) counted."""
    X, y = make_data(n, seed=4)
    dataset = torch.utils.data.TensorDataset(X, y)
    correct, total = evaluate_distributed(net, dataset, batch_size)
    # The common mistake: count everything the padded sampler hands out.
    sampler = DistributedSampler(dataset, shuffle=False)
    naive = torch.zeros(2, dtype=torch.int64, device=device)
    with torch.no_grad():
        for Xb, yb in DataLoader(dataset, batch_size, sampler=sampler):
            hits = (net(Xb.to(device)).argmax(1) == yb.to(device))
            naive += torch.stack([hits.sum(), torch.tensor(len(yb), device=device)])
    dist.all_reduce(naive)
    with torch.no_grad():  # one process, the whole set
        single = (net(X.to(device)).argmax(1) == y.to(device)).sum().item()
    emit_result(part='evaluate', n=n, correct=correct, total=total, naive_correct=naive[0].item(),
                naive_total=naive[1].item(), single_correct=single, shard=len(sampler),
                padding=sampler.total_size - n)


def part_profile(rank, world, device, trace_dir, width=256, depth=6, steps=3):
    """Profile a few DDP steps; export a Chrome trace; report when allreduces ran."""
    net = ddp(make_net((16,) + (width,) * depth + (4,)), device,
              bucket_cap_mb=width * width * 4 / 2**20)  # about a layer per bucket
    X, y = make_data(64, seed=5)
    X, y = X.to(device), y.to(device)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(2):  # warm up: DDP rebuilds its buckets after the first step
        loss_fn(net(X), y).backward()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda'
                                           else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            with record_function(f'step {i}'):
                loss = loss_fn(net(X), y)
                with record_function('backward'):
                    loss.backward()
    os.makedirs(trace_dir, exist_ok=True)
    path = os.path.join(trace_dir, f'ddp_trace_rank{rank}.json')
    prof.export_chrome_trace(path)
    intervals = profile_intervals(prof)
    span = next(e for e in intervals if e[0] == 'step 1')  # the middle step, for the picture
    emit_result(part='profile', trace=path, steps=steps,
                report=overlap_report(intervals),
                intervals=[e for e in intervals if span[1] <= e[1] <= span[2]])


class WhoLoads(Dataset):
    """A data set whose samples say which process loaded them."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, os.getpid()


def part_loader(rank, world, env, device, workers=None, batch_size=4):
    """DataLoader workers per rank with a DistributedSampler, over two epochs."""
    if workers is None:
        workers = loader_workers(env.local_world_size)
    # The DataLoader hands batch i to worker i % workers: with at least 2 batches per worker
    # every worker loads some, however many cores (and so workers) the machine has.
    n = world * batch_size * max(10, 2 * workers)
    sampler = DistributedSampler(WhoLoads(n), shuffle=True, seed=0)
    loader = DataLoader(WhoLoads(n), batch_size, sampler=sampler, num_workers=workers,
                        persistent_workers=workers > 0, pin_memory=device.type == 'cuda')
    epochs, pinned = [], False
    for epoch in range(2):
        sampler.set_epoch(epoch)  # a new shuffle, the same on every rank
        indices, pids = [], set()
        for i, pid in loader:
            indices += i.tolist()
            pids |= set(pid.tolist())
            pinned = device.type == 'cuda' and i.is_pinned()  # page-locked, ready to copy
        epochs.append({'indices': indices, 'pids': sorted(pids)})
    net = ddp(make_net(), device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
    emit_result(part='loader', workers=workers, cores=cores, pid=os.getpid(), epochs=epochs, n=n,
                pinned=pinned, plain_has_device=hasattr(make_net(), 'device'),
                param_device=str(next(net.parameters()).device),
                module_is_mlp=isinstance(net.module, MLP) and not isinstance(net, MLP))


def timed(step, net, device, steps):
    """Return the median seconds of `steps` calls of step(net), the GPU's work included."""
    runs = []
    for _ in range(steps):
        if device.type == 'cuda':
            torch.cuda.synchronize(device)  # start the clock on an idle GPU...
        start = time.perf_counter()
        step(net)
        if device.type == 'cuda':
            torch.cuda.synchronize(device)  # ...and stop it when its kernels are done, not
        runs.append(time.perf_counter() - start)  # when Python has merely queued them
    return statistics.median(runs)


def part_compile(rank, world, device, backend, steps=5):
    """torch.compile on a DDP model: graphs per bucket, equal outputs, compile and step time."""
    widths = (16, 512, 512, 512, 4)  # 1 MiB per 512x512 layer: one bucket each at 1 MiB
    X, y = make_data(32, seed=6)
    X, y = X.to(device), y.to(device)
    loss_fn = nn.CrossEntropyLoss()
    counts = {}
    for mode in (True, False):  # what dynamo hands the backend, with and without DDP's optimizer
        torch._dynamo.reset()
        torch._dynamo.config.optimize_ddp = mode
        graphs = []
        net = torch.compile(ddp(make_net(widths), device, bucket_cap_mb=1),
                            backend=counting_backend(graphs, 'eager'))
        loss_fn(net(X), y).backward()
        counts[mode] = [sum(1 for n in g.graph.nodes if 'linear' in str(n.target))
                        for g in graphs]  # Linear layers in each graph
    torch._dynamo.reset()
    torch._dynamo.config.optimize_ddp = True
    eager = ddp(make_net(widths), device, bucket_cap_mb=1)
    graphs = []
    compiled = torch.compile(ddp(make_net(widths), device, bucket_cap_mb=1),
                             backend=counting_backend(graphs, backend))

    def step(net):
        out = net(X)
        loss_fn(out, y).backward()
        return out

    outputs = []
    compile_seconds = timed(lambda net: outputs.append(step(net)), compiled, device, 1)
    out_compiled = outputs[0]  # the first call compiled
    out_eager = step(eager)
    grad_diff = max_diff(flat_grad(compiled.module), flat_grad(eager.module))
    times = {name: timed(step, net, device, steps)
             for name, net in (('eager', eager), ('compiled', compiled))}
    emit_result(part='compile', backend=backend, graphs_with_optimizer=counts[True],
                graphs_without=counts[False], graphs=len(graphs), layers=len(widths) - 1,
                out_diff=max_diff(out_compiled.detach().cpu(), out_eager.detach().cpu()),
                grad_diff=grad_diff, compile_seconds=compile_seconds,
                eager_step=times['eager'], compiled_step=times['compiled'])


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--parts', default='all', help=f'comma-separated, from {PARTS}, or all')
    parser.add_argument('--trace-dir', default=None, help='where the profile part writes traces')
    parser.add_argument('--backend', choices=BACKENDS, default=None,
                        help='process group backend: nccl (one GPU per rank) or gloo (CPU); '
                             'default: nccl when every rank has a GPU of its own')
    parser.add_argument('--compile-backend', default='aot_eager',
                        help='torch.compile backend: inductor, aot_eager, eager')
    parser.add_argument('--workers', type=int, default=None,
                        help='DataLoader workers per rank (loader part); default: loader_workers')
    args = parser.parse_args()
    parts = PARTS if args.parts == 'all' else tuple(args.parts.split(','))
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f'unknown parts {unknown}; choose from {PARTS}')
    if 'profile' in parts and not args.trace_dir:
        parser.error('the profile part needs --trace-dir (a folder for the Chrome traces)')
    env = dist_env()
    backend = pick_backend(env.local_world_size, args.backend)  # --backend, checked
    device = rank_device(backend, env.local_rank)  # bind the device before the group
    dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                            timeout=default_timeout(),
                            device_id=device if device.type == 'cuda' else None)
    rank, world = env.rank, env.world_size
    started = time.monotonic()
    trained = None
    for part in parts:
        t = time.monotonic()
        if part == 'accumulate':
            part_accumulate(rank, world, device)
        elif part == 'amp':
            part_amp(rank, world, device)
        elif part == 'join':
            trained = part_join(rank, world, device)
        elif part == 'evaluate':
            part_evaluate(rank, world, device, trained or make_net().to(device))
        elif part == 'profile':
            part_profile(rank, world, device, args.trace_dir)
        elif part == 'loader':
            part_loader(rank, world, env, device, args.workers)
        elif part == 'compile':
            part_compile(rank, world, device, args.compile_backend)
        if rank == 0:
            print(f'{part}: {time.monotonic() - t:.1f} s', flush=True)
    emit_result(part='done', backend=backend, seconds=time.monotonic() - started)
    dist.destroy_process_group()
    exit_now()  # DDP keeps gloo's threads alive, and Python's own teardown can abort on them


if __name__ == '__main__':
    main()
