"""Point-to-point messages: blocking send/recv, a deadlock, and a batched isend/irecv around a ring.

Run:  torchrun --standalone --nproc-per-node=3 scripts/collectives_p2p.py
"""
import datetime
import time

import torch
import torch.distributed as dist

from d2lpar.distributed import default_timeout, emit_result

dist.init_process_group('gloo', timeout=default_timeout())
rank, n = dist.get_rank(), dist.get_world_size()
report = {'world_size': n}

# 1. Blocking: send() returns once the data is handed over, recv() once it has arrived.
#    The receiver allocates the tensor: shape and dtype must match what is sent.
if rank == 0:
    X = torch.arange(4.0)
    dist.send(X, dst=1)
    print(f'sent {X.tolist()} to rank 1')
elif rank == 1:
    X = torch.empty(4)
    report['received_from'] = dist.recv(X, src=0)  # recv returns the sender's rank
    report['received'] = X.tolist()
    print(f'received {X.tolist()} from rank {report["received_from"]}')

# 2. recv(src=None) takes a message from whichever rank sends first. Messages are
#    matched by sender and tag only, so a tag keeps this one apart from later messages
#    (rank 2 may already be sending its ring message of part 4 to rank 0).
if rank == 0:
    senders = []
    for _ in range(n - 1):
        X = torch.empty(1)
        senders.append(dist.recv(X, tag=1))
        assert X.item() == 10 * senders[-1]
    report['senders'] = senders
    print(f'messages arrived from ranks {senders}, in that order')
else:
    dist.send(torch.tensor([10.0 * rank]), dst=0, tag=1)

# 3. Ranks 0 and 1 both send() first, then recv(): each waits for the other to reach
#    recv(), which never happens. A group with a 2 s timeout turns the hang into an error.
if n >= 2:
    pair = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2))
    if rank < 2:
        other = 1 - rank
        start = time.perf_counter()
        try:
            dist.send(torch.ones(1), other, group=pair)
            dist.recv(torch.empty(1), other, group=pair)
            report['deadlock'] = None
        except RuntimeError as e:
            message = str(e).split('] ', 1)[-1][:100]  # drop gloo's source location
            report['deadlock'] = {'seconds': time.perf_counter() - start, 'error': message}
            print(f'send-then-recv on both sides failed after '
                  f'{report["deadlock"]["seconds"]:.1f} s: {message}')

# 4. Non-blocking: batch_isend_irecv posts an isend and an irecv together and returns
#    at once with their requests; wait() completes each. Posting both before waiting lets
#    every rank send right and receive from the left. (One batch, as NCCL requires of a
#    send and a receive between the same two GPUs: with 2 ranks, right is left.)
right, left = (rank + 1) % n, (rank - 1) % n
outbox, inbox = torch.full((3,), float(rank)), torch.empty(3)
start = time.perf_counter()
requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, outbox, right), dist.P2POp(dist.irecv, inbox, left)])
for request in requests:
    request.wait()
report['ring'] = {'from': left, 'got': inbox.tolist(), 'seconds': time.perf_counter() - start}
print(f'ring step: sent {outbox.tolist()} to rank {right}, got {inbox.tolist()} from rank {left}')

emit_result(report)
dist.destroy_process_group()
