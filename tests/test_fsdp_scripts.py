"""Notebook 11's script starts the process group that its GPU run needs, in every version.

`dcp.async_save` refuses a group without a CPU backend, and a group started as plain 'nccl' has
none (torch's `backend_capability`: NCCL serves CUDA only). The GPU rows cannot show this on a
machine without GPUs (they swap in gloo), so here the script's first and last versions run, as
the notebook writes them (the last by applying each diff it shows), with `--backend nccl
--device cuda` up to `init_process_group`, which records the backend it was given and stops the
script; torch's own `BackendConfig` then says which devices that group serves.
"""

import json
import re
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig

from d2lpar.machinery.saving import apply_diff

NOTEBOOK = Path(__file__).resolve().parent.parent / 'notebooks' / '11_fsdp2.ipynb'


class Started(Exception):
    """Raised by the stand-in `init_process_group` to stop the script there."""


def scripts():
    """Return {name: text} of every script notebook 11 writes: whole, or by `d2lpar.write_next`."""
    written = {}
    for cell in json.loads(NOTEBOOK.read_text())['cells']:
        source = ''.join(cell['source'])
        first, _, body = source.partition('\n')
        if cell['cell_type'] == 'code' and first.startswith('%%writefile {work}/'):
            written[first.removeprefix('%%writefile {work}/').strip()] = body
        elif cell['cell_type'] == 'code' and source.startswith('d2lpar.write_next('):
            old, new = re.findall(r"work / '([\w.]+)'", first)
            diff = source.split("r'''", 1)[1].rsplit("'''", 1)[0]
            written[new] = apply_diff(written[old], diff)
    return written


def script(name):
    """Return the script that notebook 11 writes as `{work}/<name>`."""
    written = scripts()
    assert name in written, f'notebook 11 writes no {name}'
    return written[name]


def backend_started(name, flags, monkeypatch):
    """Run script `name` with `flags` up to init_process_group; return the backend it passes."""

    def init_process_group(backend=None, **kwargs):
        raise Started(backend)

    monkeypatch.setattr(dist, 'init_process_group', init_process_group)
    monkeypatch.setattr(torch.cuda, 'set_device', lambda device: None)  # no GPU here
    monkeypatch.setenv('LOCAL_RANK', '0')
    monkeypatch.setitem(sys.modules, 'fsdp_steps', types.ModuleType('fsdp_steps'))
    monkeypatch.setattr(sys, 'argv', [name, 'resume', *flags])  # stops before any part runs
    with pytest.raises(Started) as started:
        exec(compile(script(name), name, 'exec'), {'__name__': '__main__'})
    return started.value.args[0]


@pytest.mark.parametrize('name', ['fsdp_train.py', 'fsdp_resume.py'])
def test_an_nccl_group_also_serves_cpu_tensors(name, monkeypatch):
    backend = backend_started(name, ['--backend', 'nccl', '--device', 'cuda'], monkeypatch)
    devices = BackendConfig(backend).get_device_backend_map()
    assert devices.get('cuda') == 'nccl', devices
    assert 'cpu' in devices, f'{name} starts {backend!r}: dcp.async_save needs a CPU backend'


def test_plain_nccl_serves_no_cpu_tensors():
    """The test above would fail on the old scripts: torch maps plain 'nccl' to CUDA only."""
    assert 'cpu' not in BackendConfig('nccl').get_device_backend_map()


@pytest.mark.parametrize('name', ['fsdp_train.py', 'fsdp_resume.py'])
def test_the_cpu_run_starts_gloo(name, monkeypatch):
    backend = backend_started(name, ['--backend', 'gloo', '--device', 'cpu'], monkeypatch)
    assert BackendConfig(backend).get_device_backend_map() == {'cpu': 'gloo', 'cuda': 'gloo'}


def test_every_diff_applies_and_each_version_compiles():
    written = scripts()
    assert len(written) >= 10, sorted(written)  # the first version and each step
    for name, text in written.items():
        compile(text, name, 'exec')
