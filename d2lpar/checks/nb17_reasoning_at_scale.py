"""Argument checks for the predictor notebook 17 teaches (d2lpar/lessons/nb17_reasoning_at_scale.py).

Each check takes the same arguments as the function it guards and raises a ValueError naming the
function and what to do; `make lib` writes `@checked(CHECKS[name])` above that definition.
"""

from d2lpar.checks import positive_int

_POLICIES = ('full', 'none', 'selective')


def _check_layout(caller, cfg, gpus, local_batch, seq_len, ac, tp, pp, microbatches=None):
    if not isinstance(cfg, dict) or not {'dim', 'n_layers', 'n_heads', 'n_kv_heads', 'hidden', 'vocab'} <= set(cfg):
        raise ValueError(
            f'{caller}: cfg must be a dict with dim, n_layers, n_heads, n_kv_heads, hidden '
            "and vocab, such as scale.LLAMA3['8B']"
        )
    for name, value in (('gpus', gpus), ('local_batch', local_batch), ('seq_len', seq_len), ('tp', tp), ('pp', pp)):
        positive_int(value, f'{caller}: {name}')
    if microbatches is not None:
        positive_int(microbatches, f'{caller}: microbatches')
    if ac not in _POLICIES:
        raise ValueError(f'{caller}: ac must be one of {list(_POLICIES)}, got {ac!r}')
    if gpus % (tp * pp):
        raise ValueError(f'{caller}: tp * pp = {tp * pp} must divide gpus={gpus}; choose degrees that divide it')


def _check_predict_memory(cfg, gpus, local_batch, seq_len, ac='selective', tp=1, pp=1, microbatches=None):
    _check_layout('predict_memory', cfg, gpus, local_batch, seq_len, ac, tp, pp, microbatches)


def _check_predict(
    cfg,
    gpus,
    local_batch,
    seq_len,
    ac='selective',
    tp=1,
    pp=1,
    microbatches=None,
    stages_per_rank=1,
    gpu=None,
    efficiency=1.0,
):
    _check_layout('predict', cfg, gpus, local_batch, seq_len, ac, tp, pp, microbatches)
    positive_int(stages_per_rank, 'predict: stages_per_rank')
    if not 0 < efficiency <= 1:
        raise ValueError(f'predict: efficiency is a share of the GPU\'s matmul ceiling, in (0, 1], got {efficiency}')


CHECKS = {
    'predict_memory': _check_predict_memory,
    'predict': _check_predict,
}
