"""Notebook 6's checker, check_slurm_ranks: wrong answers get their hint."""

import re

import pytest

import d2lpar
import d2lpar.distributed
from d2lpar import exercises

from .reference import assert_rejected, solution, wrong_ids


def slurm_variant(**wrong):
    """Return the reference slurm_ranks with the fields in `wrong` computed another way."""

    def slurm_ranks(environ):
        right = solution('06_ddp_launching', 'slurm_ranks')(environ)
        return {**right, **{key: how(environ) for key, how in wrong.items()}}

    return slurm_ranks


def first_of_split(environ):
    return environ['SLURM_NODELIST'].split(',')[0]


def glued_digits(environ):
    return '.'.join(re.findall('[0-9]+', environ['SLURM_NODELIST']))


def unpadded_first(environ):
    first = solution('06_ddp_launching', 'slurm_ranks')(environ)['master_addr']
    return re.sub(r'(?<![0-9])0+(?=[0-9])', '', first)


def own_node(environ):
    hosts = d2lpar.distributed.expand_nodelist(environ['SLURM_NODELIST'])
    return hosts[int(environ['SLURM_NODEID'])]


def accepts_any_rank(environ):
    return {
        'rank': int(environ['SLURM_PROCID']),
        'local_rank': int(environ['SLURM_LOCALID']),
        'world_size': int(environ['SLURM_NTASKS']),
        'master_addr': d2lpar.distributed.expand_nodelist(environ['SLURM_NODELIST'])[0],
    }


WRONG = [
    (
        exercises.check_slurm_ranks,
        slurm_variant(rank=lambda e: int(e['SLURM_NODEID'])),
        'SLURM_NODEID numbers the machines',
    ),
    (
        exercises.check_slurm_ranks,
        slurm_variant(world_size=lambda e: int(e['SLURM_NNODES'])),
        'counts processes, not machines',
    ),
    (exercises.check_slurm_ranks, slurm_variant(local_rank=lambda e: int(e['SLURM_PROCID'])), 'SLURM_LOCALID'),
    (exercises.check_slurm_ranks, slurm_variant(rank=lambda e: e['SLURM_PROCID']), 'as an int'),
    (exercises.check_slurm_ranks, slurm_variant(master_addr=first_of_split), 'expand the node list'),
    (exercises.check_slurm_ranks, slurm_variant(master_addr=glued_digits), 'not IP addresses'),
    (exercises.check_slurm_ranks, slurm_variant(master_addr=unpadded_first), 'zero padding'),
    (exercises.check_slurm_ranks, slurm_variant(master_addr=own_node), "this task's own node"),
    (exercises.check_slurm_ranks, accepts_any_rank, 'was accepted'),
]


@pytest.mark.parametrize('check,answer,hint', WRONG, ids=wrong_ids(WRONG))
def test_wrong_answer_fails_with_its_hint(check, answer, hint):
    assert_rejected(check, answer, hint)
