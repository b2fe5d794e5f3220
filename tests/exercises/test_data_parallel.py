"""Notebook 3's checker, check_load_checkpoint: wrong answers get their hint."""

import pytest

from d2lpar import exercises

from .reference import assert_rejected, wrong_ids


def no_strip_strict_false(net, state_dict):
    net.load_state_dict(state_dict, strict=False)


def strip_strict_false(net, state_dict):
    net.load_state_dict({k.removeprefix('module.'): v for k, v in state_dict.items()}, strict=False)


def strip_with_replace(net, state_dict):
    net.load_state_dict({k.replace('module.', ''): v for k, v in state_dict.items()})


def strip_with_lstrip(net, state_dict):
    net.load_state_dict({k.lstrip('module.'): v for k, v in state_dict.items()})


def always_strips(net, state_dict):
    net.load_state_dict({k[len('module.') :]: v for k, v in state_dict.items()})


WRONG = [
    (exercises.check_load_checkpoint, no_strip_strict_false, 'strict=False'),
    (exercises.check_load_checkpoint, no_strip_strict_false, 'nothing was loaded'),
    (exercises.check_load_checkpoint, strip_strict_false, 'strict=False silently ignores'),
    (exercises.check_load_checkpoint, strip_with_replace, ".replace('module.', '')"),
    (exercises.check_load_checkpoint, always_strips, "no 'module.' prefix"),
    (exercises.check_load_checkpoint, strip_with_lstrip, 'a set of characters'),
]


@pytest.mark.parametrize('check,answer,hint', WRONG, ids=wrong_ids(WRONG))
def test_wrong_answer_fails_with_its_hint(check, answer, hint):
    assert_rejected(check, answer, hint)
