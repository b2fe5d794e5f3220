"""Run by d2lpar.run_with_mask in a child under a CUDA_VISIBLE_DEVICES mask.

The child runs the snippet or script first (so that it can set variables
before anything imports torch), then reports as one JSON line. It counts
devices after initialising CUDA: before that, torch.cuda.device_count()
asks NVML and re-reads the environment, which the driver no longer does
(since torch 2.12 it asks the runtime once CUDA has started). GPUs that NVML
counts while CUDA cannot start (a driver too old for the build) are not usable:
they count as none, as in d2lpar.num_gpus.
"""

import json
import os
import runpy
import sys

sys.path[0] = ''  # as under `python -c`: the working folder first, not this one's
spec = json.loads(sys.argv[1])
report = {}
if spec['script'] is None:
    exec(compile(spec['code'], '<snippet>', 'exec'), {'__name__': '__main__', 'report': report})
else:
    sys.argv = [spec['script'], *spec['args']]
    runpy.run_path(spec['script'], init_globals={'report': report}, run_name='__main__')
import torch  # noqa: E402 (after the child's code, which may set CUDA variables first)

available = torch.cuda.is_available()
if available:
    torch.cuda.init()
props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count() if available else 0)]
seen = {
    'pid': os.getpid(),
    'mask': os.environ.get('CUDA_VISIBLE_DEVICES'),
    'cuda_available': available,
    'device_count': len(props),
    'names': [p.name for p in props],
    'uuids': [str(getattr(p, 'uuid', '')) for p in props],
    'env': {
        k: v for k, v in os.environ.items() if 'CUDA' in k.upper() or 'VISIBLE' in k.upper() or k.startswith('OMP_')
    },
    'report': report,
}
print('\n' + spec['marker'] + json.dumps(seen, default=str), flush=True)
