"""Generated bad input never reaches a raw traceback, and never turns into NaN.

For each public function, Hypothesis replaces one argument of a valid call with
a bad value (NaN, infinity, negative, zero, a wrong type, an empty or
mismatched tensor, a device that does not exist) and the outcome must be
either a TypeError or ValueError whose message names the function or the
argument, or a result without NaN in it. Any other exception fails the test.
The runs are derandomized, so the suite sees the same cases every time.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import d2lpar
from d2lpar import collectives, pipelining, tensor_parallel

NAN, INF = float('nan'), float('inf')
BAD = [
    NAN,
    INF,
    -INF,
    -1,
    0,
    -0.5,
    1e300,
    '',
    'abc',
    None,
    True,
    [],
    {},
    (),
    object(),
    torch.tensor(NAN),
    torch.empty(0),
    torch.ones(3, 5),
    torch.zeros(2, 1, 32, 32),
    'cuda:7',
    torch.device('cuda', 3),
    'gpu',
    [None],
    [torch.ones(2), 'x'],
    -(2**70),
]
CPU = torch.device('cpu')


def lenet_params():
    return d2lpar.init_lenet_params(seed=0)


def images(n=4):
    return torch.rand(n, 1, 28, 28)


def labels(n=4):
    return torch.arange(n) % 10


# name: (callable, {argument: factory of a valid value}); arguments in call order.
API = {
    'try_gpu': (d2lpar.try_gpu, {'i': lambda: 0}),
    'device_slots': (lambda n: d2lpar.device_slots(n, verbose=False), {'n': lambda: 2}),
    'Timer': (d2lpar.Timer, {'device': lambda: None}),
    'Accumulator': (d2lpar.Accumulator, {'n': lambda: 2}),
    'Animator.add': (lambda x, y: d2lpar.Animator().add(x, y), {'x': lambda: 1, 'y': lambda: 0.5}),
    'get_fashion_mnist_labels': (d2lpar.get_fashion_mnist_labels, {'labels': lambda: [0, 9]}),
    'TensorLoader': (d2lpar.TensorLoader, {'X': images, 'y': labels, 'batch_size': lambda: 2}),
    'allreduce_cost': (
        collectives.allreduce_cost,
        {
            'algorithm': lambda: 'ring',
            'n': lambda: 4,
            'size': lambda: 2**20,
            'bandwidth': lambda: 1e9,
            'latency': lambda: 1e-5,
        },
    ),
    'bandwidths': (collectives.bandwidths, {'size': lambda: 2**20, 'seconds': lambda: 0.01, 'n': lambda: 4}),
    'scatter': (d2lpar.scatter, {'data': images, 'devices': lambda: [CPU, CPU]}),
    'split_batch': (d2lpar.split_batch, {'X': images, 'y': labels, 'devices': lambda: [CPU, CPU]}),
    'get_params': (d2lpar.get_params, {'params': lenet_params, 'device': lambda: CPU}),
    'allreduce': (d2lpar.allreduce, {'data': lambda: [torch.ones(2), torch.ones(2)]}),
    'lenet': (d2lpar.lenet, {'X': images, 'params': lenet_params}),
    'init_lenet_params': (d2lpar.init_lenet_params, {'scale': lambda: 0.1, 'seed': lambda: 0}),
    'train_batch': (
        d2lpar.train_batch,
        {
            'X': images,
            'y': labels,
            'device_params': lambda: [d2lpar.get_params(lenet_params(), CPU)],
            'devices': lambda: [CPU],
            'lr': lambda: 0.1,
        },
    ),
    'bubble_fraction': (d2lpar.bubble_fraction, {'num_stages': lambda: 2, 'num_microbatches': lambda: 4}),
    'pipeline_schedule': (d2lpar.pipeline_schedule, {'num_stages': lambda: 2, 'num_microbatches': lambda: 4}),
    'schedule_problems': (
        d2lpar.schedule_problems,
        {'events': lambda: d2lpar.pipeline_schedule(2, 4), 'num_stages': lambda: 2, 'num_microbatches': lambda: 4},
    ),
    'parse_visible_devices': (d2lpar.parse_visible_devices, {'mask': lambda: '0,1'}),
    'scatter_inputs': (d2lpar.scatter_inputs, {'inputs': images, 'devices': lambda: [CPU, CPU]}),
    'gather': (d2lpar.gather, {'outputs': lambda: [torch.ones(2, 3), torch.ones(2, 3)], 'output_device': lambda: CPU}),
    'Residual': (d2lpar.Residual, {'num_channels': lambda: 4}),
    'block_bytes': (
        tensor_parallel.block_bytes,
        {
            'num_params': lambda: 1000,
            'tokens': lambda: 64,
            'dim': lambda: 16,
            'n': lambda: 4,
            'replicated': lambda: 10,
            'bytes_per_value': lambda: 2,
        },
    ),
    'interleaved_bubble': (pipelining.interleaved_bubble, {'p': lambda: 4, 'm': lambda: 8, 'v': lambda: 2}),
    'replay': (
        pipelining.replay,
        {
            'events': lambda: [
                (0, 0, 0, 'F', 0.0, 1.0),
                (1, 1, 0, 'F', 1.0, 2.0),
                (1, 1, 0, 'B', 2.0, 4.0),
                (0, 0, 0, 'B', 4.0, 6.0),
            ],
            'v': lambda: 1,
        },
    ),
}


def has_nan(value, depth=0):
    """Return True if a result holds NaN anywhere (numbers, tensors, lists, dicts)."""
    if depth > 4:
        return False
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, torch.Tensor):
        return value.is_floating_point() and bool(torch.isnan(value).any())
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return any(has_nan(v, depth + 1) for v in value)
    return False


def names_the_problem(error, function, argument):
    text = str(error)
    short = function.split('.')[-1]
    return short in text or argument in text or function in text


@pytest.mark.parametrize('function', sorted(API))
def test_valid_calls_work(function):
    """The baseline: with every argument valid, the call succeeds (so failures are the bad one's)."""
    call, arguments = API[function]
    result = call(*[make() for make in arguments.values()])
    assert not has_nan(result)


@pytest.mark.parametrize('function', sorted(API))
@settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_bad_input_gets_a_clear_error_or_a_clean_result(function, data):
    call, arguments = API[function]
    names = list(arguments)
    argument = data.draw(st.sampled_from(names), label='argument')
    bad = data.draw(st.sampled_from(BAD), label='bad value')
    values = [bad if name == argument else arguments[name]() for name in names]
    try:
        result = call(*values)
    except (TypeError, ValueError) as error:
        assert names_the_problem(error, function, argument), (
            f'{function}({argument}={bad!r}): the error does not say what was wrong: {type(error).__name__}: {error}'
        )
        return
    except Exception as error:  # noqa: BLE001 - anything else is the defect this test is for
        pytest.fail(f'{function}({argument}={bad!r}) raised {type(error).__name__}: {error}')
    assert not has_nan(result), f'{function}({argument}={bad!r}) returned NaN: {result!r}'


# Four inputs that used to get a raw or silent answer (issue 25).
def test_accumulator_add_refuses_a_string_and_adds_nothing():
    metric = d2lpar.Accumulator(2)
    metric.add(1, 2)
    with pytest.raises(TypeError, match=r"Accumulator\.add: value 0 must be a number.*'a'"):
        metric.add('a', 1)
    with pytest.raises(TypeError, match=r'Accumulator\.add: value 1'):
        metric.add(1, torch.ones(3))  # a tensor of three values is no number either
    assert metric.data == [1.0, 2.0]  # nothing half added
    metric.add(torch.tensor(1.5), 1)  # a one-element tensor is a number
    assert metric.data == [2.5, 3.0]


@pytest.mark.parametrize('shape', [dict(nrows=2), dict(ncols=3), dict(nrows=2, ncols=2)])
def test_animator_refuses_several_subplots_instead_of_drawing_into_one(shape):
    with pytest.raises(ValueError, match='Animator draws one plot'):
        d2lpar.Animator(**shape)


@pytest.mark.parametrize('name', ['xlim', 'ylim'])
@pytest.mark.parametrize('bad', ['bad', 3, [1], [1, 2, 3], ['a', 1], [True, 2]])
def test_animator_refuses_bad_limits_when_built_not_at_the_first_add(name, bad):
    with pytest.raises(ValueError, match=f'Animator: {name} must be None or a pair'):
        d2lpar.Animator(**{name: bad})


@pytest.mark.parametrize('limits', [None, [0, 1], (0.5, None), [None, 2], torch.tensor([0.0, 3.0])])
def test_animator_takes_good_limits(limits, capsys):
    d2lpar.Animator(xlim=limits, ylim=limits).add(1, 0.5)
    assert '0.5' in capsys.readouterr().out


CHECKED = [
    (d2lpar.scatter_inputs, (torch.ones(4, 2), [CPU, CPU]), 'scatter_inputs'),
    (d2lpar.HandDataParallel, (torch.nn.Linear(2, 2), [CPU]), 'HandDataParallel'),
    (d2lpar.evaluate_accuracy_gpu, (lambda X: X, []), 'evaluate_accuracy_gpu'),
    (d2lpar.train, (1, 16, 0.1), 'train'),
]


@pytest.mark.parametrize('function, args, public', CHECKED, ids=[c[2] for c in CHECKED])
def test_an_unknown_keyword_names_the_public_function_not_its_checker(function, args, public):
    with pytest.raises(TypeError) as caught:
        function(*args, data=1)
    message = str(caught.value)
    assert message.startswith(public + '(') and "'data'" in message, message
    assert '_check' not in message, message
    with pytest.raises(TypeError) as caught:
        function()  # a missing argument, too
    assert str(caught.value).startswith(public + '(') and '_check' not in str(caught.value)
