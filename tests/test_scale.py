"""d2lpar.scale: the predictor against fake runs, and the MFU check."""

import pytest

from d2lpar import scale

CFG = scale.LLAMA3['8B']


@pytest.mark.parametrize('ac', ['none', 'selective', 'full'])
def test_predictor_matches_a_fake_run(ac):
    for L in (1, 2):
        run = scale.fake_step(CFG, 16, 2, 8192, L, ac=ac)
        p = scale.predict(dict(CFG, n_layers=L), 16, 2, 8192, ac=ac)
        assert all(abs(p['sent'][k] - v) <= 1e-9 * v for k, v in run['sent'].items())
        assert p['hardware_flops'] == run['flops']
        assert abs(p['peak'] / run['peak']['total'] - 1) < 1e-3


def test_model_flops_are_six_per_weight_plus_attention():
    blocks, rest = scale.num_params(CFG)
    assert blocks + rest == 8_030_261_248  # Llama 3.1 8B's published parameter count
    matmul = blocks - 2 * 32 * 4096 + 128256 * 4096
    assert scale.model_flops_per_token(CFG, 8192) == 6 * matmul + 12 * 32 * 4096 * 8192


def test_check_mfu_refuses_the_impossible():
    assert scale.check_mfu(0.4) == 0.4
    for bad in (0, 1.2, 0.81, -0.1):
        with pytest.raises(ValueError, match='check_mfu'):
            scale.check_mfu(bad)


def test_predict_refuses_an_unknown_checkpointing():
    with pytest.raises(ValueError, match='predict'):
        scale.predict(CFG, 8, 1, 2048, ac='some')


def _largest(cfg, gpus, seq_len, ac, limit, strict=False):
    batch = 0
    while (p := scale.predict(cfg, gpus, batch + 1, seq_len, ac=ac)['peak']) < limit or (not strict and p == limit):
        batch += 1
    return batch


def one_too_many(*args):
    return _largest(*args) + 1


def one_too_few(*args):
    return max(_largest(*args) - 1, 0)


def as_float(*args):
    return float(_largest(*args))


def ignores_checkpointing(cfg, gpus, seq_len, ac, limit):
    return _largest(cfg, gpus, seq_len, 'full', limit)


@pytest.mark.parametrize(
    'wrong, hint',
    [(one_too_many, 'more than the limit'), (one_too_few, 'also fits'), (as_float, 'non-negative int')],
    ids=lambda x: getattr(x, '__name__', None),
)
def test_largest_batch_wrong_answers_get_their_hint(wrong, hint):
    from d2lpar import exercises

    for seed in range(3):
        verdict = exercises.check_largest_batch(wrong, seed=seed)
        assert not verdict.passed and verdict.attempted and hint in verdict.message, verdict


def test_largest_batch_catches_a_rule_that_ignores_checkpointing():
    from d2lpar import exercises

    assert not all(exercises.check_largest_batch(ignores_checkpointing, seed=s).passed for s in range(5))


@pytest.mark.parametrize('gpus', [1, 2])
def test_predictor_matches_a_fake_run_on_one_or_two_ranks(gpus):
    """FSDP2 keeps the root's bf16 copy on one rank too; the GPU row of verify/gpucheck.py uses this model."""
    cfg = dict(dim=1024, n_layers=2, n_heads=8, n_kv_heads=4, hidden=2816, vocab=32000)
    for ac in ('selective', 'full'):
        run = scale.fake_step(cfg, gpus, 2, 1024, 2, ac=ac)
        p = scale.predict(cfg, gpus, 2, 1024, ac=ac)
        assert abs(p['peak'] / run['peak']['total'] - 1) < 1e-3, (ac, p['peak'], run['peak'])
        assert p['hardware_flops'] == run['flops']


def test_predict_refuses_bad_layouts_by_name():
    with pytest.raises(ValueError, match='predict: tp \\* pp = 16 must divide gpus=8'):
        scale.predict(CFG, 8, 1, 2048, tp=4, pp=4)
    with pytest.raises(ValueError, match='predict: local_batch must be a positive int'):
        scale.predict(CFG, 8, 0, 2048)
    with pytest.raises(ValueError, match='predict_memory: ac must be one of'):
        scale.predict_memory(CFG, 8, 1, 2048, ac='some')
