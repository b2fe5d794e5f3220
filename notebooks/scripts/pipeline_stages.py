"""Pipeline parallelism with torch.distributed.pipelining: one stage per process, GPipe and 1F1B.

Run:  torchrun --standalone --nproc-per-node=2 scripts/pipeline_stages.py --microbatches 4 --ms 10
Each rank builds notebook 4's network (make_net, 9 layers), keeps its stage (the layers
ModelParallel would give it) and runs one training step with ScheduleGPipe and one with
Schedule1F1B, after a warm-up step each. At the end of every stage a stand-in device (as in
notebook 4) sleeps --ms milliseconds per micro-batch in forward and twice as long in
backward, recording when; hooks count the micro-batches whose activations the stage holds
(forward done, backward not yet started). Every rank hands back its stage's gradients, the
last stage its output and losses. With 2 processes it also pipelines the MLP of
scripts/tensor_parallel.py over 2 stages and counts the bytes each stage sends.
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from d2lpar.distributed import default_timeout, emit_result, exit_now

parser = argparse.ArgumentParser()
parser.add_argument('--microbatches', type=int, default=4)
parser.add_argument('--ms', type=float, default=10, help='stand-in forward time per micro-batch')
parser.add_argument('--batch', type=int, default=32)
parser.add_argument('--mlp-batches', type=int, nargs='*', default=[32, 128])
args = parser.parse_args()
dist.init_process_group('gloo', timeout=default_timeout())
rank, p = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
m = args.microbatches


def make_net(width=32, depth=4, num_inputs=64, num_outputs=10):
    """Notebook 4's network, narrower: Linear-ReLU pairs, then a Linear to the outputs."""
    torch.manual_seed(0)
    layers = [nn.Linear(num_inputs, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, num_outputs))


class Busy(torch.autograd.Function):
    """Return a copy of X after the recorder's seconds; backward takes twice as long."""

    @staticmethod
    def forward(ctx, X, recorder):
        ctx.recorder, ctx.j = recorder, recorder.forwards
        recorder.forwards += 1
        recorder.sleep('F', ctx.j, 1)
        return X.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.recorder.sleep('B', ctx.j, 2)
        return grad, None


class StandInDevice(nn.Module):
    """Keep the stage busy for a fixed time per micro-batch; record (stage, j, phase, start, end)."""

    def __init__(self, stage, seconds):
        super().__init__()
        self.stage, self.seconds = stage, seconds
        self.reset()

    def reset(self):
        self.events, self.forwards = [], 0

    def sleep(self, phase, j, factor):
        start = time.time()  # one clock for all processes of this machine
        time.sleep(factor * self.seconds)
        self.events.append((self.stage, j, phase, start, time.time()))

    def forward(self, X):
        return Busy.apply(X, self)


class InFlight:
    """Count the micro-batches whose forward ran and whose backward has not started, and the peak."""

    def __init__(self, module):
        self.alive = self.peak = 0
        module.register_forward_hook(self.forward_done)

    def forward_done(self, module, args, out):
        self.alive += 1
        self.peak = max(self.peak, self.alive)
        out.register_hook(self.backward_started)  # called when the output's gradient arrives

    def backward_started(self, grad):
        self.alive -= 1


def stage_layers(net, i, num_stages):
    """The layers of stage i, as ModelParallel balances them (the first n % p stages one more)."""
    n = len(net)
    balance = [n // num_stages + (1 if k < n % num_stages else 0) for k in range(num_stages)]
    start = sum(balance[:i])
    return list(net)[start:start + balance[i]]


def run(schedule, X, y):
    """One training step of this rank's share; return the last stage's output and losses."""
    losses = []
    if rank == 0:
        out = schedule.step(X)
    elif rank == p - 1:
        out = schedule.step(target=y, losses=losses)
    else:
        out = schedule.step()
    return out, losses


g = torch.Generator().manual_seed(1)
X, y = torch.randn(args.batch, 64, generator=g), torch.randint(0, 10, (args.batch,), generator=g)
report = {'stages': p, 'microbatches': m, 'seconds': args.ms / 1000, 'batch': args.batch,
          'layers': [len(stage_layers(make_net(), i, p)) for i in range(p)]}
for name, Schedule in [('GPipe', ScheduleGPipe), ('1F1B', Schedule1F1B)]:
    standin = StandInDevice(rank, args.ms / 1000)
    module = nn.Sequential(*stage_layers(make_net(), rank, p), standin)
    in_flight = InFlight(module)
    stage = PipelineStage(module, rank, p, torch.device('cpu'))
    schedule = Schedule(stage, n_microbatches=m, loss_fn=nn.CrossEntropyLoss())
    run(schedule, X, y)  # warm-up: the stages also exchange shapes here
    module.zero_grad()
    standin.reset()
    in_flight.alive = in_flight.peak = 0
    dist.barrier()
    out, losses = run(schedule, X, y)
    report[name] = dict(grads=[q.grad for q in module.parameters()], events=standin.events,
                        peak_in_flight=in_flight.peak, alive_after=in_flight.alive,
                        output=out, loss=sum(l.item() for l in losses) / m if losses else None)

if p == 2:  # the MLP of scripts/tensor_parallel.py, cut between its two linears
    D, H = 16, 64
    report['bytes'] = {}
    for B in args.mlp_batches:
        torch.manual_seed(0)
        mlp = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, D))
        module = mlp[:2] if rank == 0 else mlp[2:]
        stage = PipelineStage(module, rank, p, torch.device('cpu'))
        schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=lambda out, target: out.pow(2).mean())
        sent = {'bytes': 0, 'messages': 0}
        for method in ('get_fwd_send_ops', 'get_bwd_send_ops'):  # every tensor a stage sends
            def counting(*a, original=getattr(stage, method)):
                ops = original(*a)
                sent['bytes'] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
                sent['messages'] += len(ops)
                return ops
            setattr(stage, method, counting)
        Xb = torch.randn(B, D, generator=g)
        run(schedule, Xb, torch.zeros(B, D))  # warm-up
        sent.update(bytes=0, messages=0)
        run(schedule, Xb, torch.zeros(B, D))
        report['bytes'][B] = dict(sent)

print(f'rank {rank}: stage of {report["layers"][rank]} layers, GPipe and 1F1B done')
emit_result(report)
dist.destroy_process_group()
exit_now()
