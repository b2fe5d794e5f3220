"""Timer, Accumulator and a headless Animator."""

import time

import pytest

import d2lpar


def test_timer_records_and_sums():
    timer = d2lpar.Timer()
    for pause in (0.01, 0.02):
        timer.start()
        time.sleep(pause)
        timer.stop()
    assert len(timer.times) == 2
    assert timer.times[0] >= 0.01 and timer.times[1] >= 0.02
    assert timer.sum() == pytest.approx(sum(timer.times))
    assert timer.avg() == pytest.approx(timer.sum() / 2)
    assert timer.cumsum() == pytest.approx([timer.times[0], timer.sum()])


def test_timer_waits_for_every_gpu_or_the_one_given(monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, 'synchronize', calls.append)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_initialized', lambda: True)
    monkeypatch.delattr(torch._C, '_cuda_hasPrimaryContext', raising=False)
    timer = d2lpar.Timer()  # waits at start and at stop, for cuda:0 and cuda:1
    timer.stop()
    assert calls == [0, 1, 0, 1]
    calls.clear()
    timer = d2lpar.Timer('cuda:1')
    timer.stop()
    assert calls == [torch.device('cuda:1')] * 2
    calls.clear()
    d2lpar.Timer('cpu').stop()
    assert calls == []


def test_timer_avg_without_times():
    timer = d2lpar.Timer()
    with pytest.raises(RuntimeError, match='stop'):
        timer.avg()


def test_accumulator():
    metric = d2lpar.Accumulator(2)
    metric.add(3, 4)
    metric.add(1.5, 2)
    assert (metric[0], metric[1]) == (4.5, 6.0)
    with pytest.raises(ValueError, match='holds 2 sums'):
        metric.add(1)
    metric.reset()
    assert metric.data == [0.0, 0.0]


def test_animator_headless_prints_points(capsys):
    animator = d2lpar.Animator(xlabel='epoch', legend=['train loss', 'test acc'])
    animator.add(1, (0.5, 0.75))
    animator.add(2, (0.25, None))
    out = capsys.readouterr().out.splitlines()
    assert out == ['epoch 1: train loss 0.5, test acc 0.75', 'epoch 2: train loss 0.25']
    assert animator.X == [[1, 2], [1]] and animator.Y == [[0.5, 0.25], [0.75]]
    png = animator.png()
    assert png.startswith(b'\x89PNG') and len(png) > 1000
    with pytest.raises(ValueError, match='has 2 lines'):
        animator.add(3, (1, 2, 3))


def test_animator_takes_tensors_and_a_single_legend(capsys):
    import torch

    animator = d2lpar.Animator(xlabel='epoch', legend='loss')
    animator.add(torch.tensor(1), torch.tensor(0.5))  # 0-d tensors, as a loss.item()-less call
    animator.add(2, torch.tensor([0.25]))
    assert animator.legend == ['loss']
    assert animator.X == [[1, 2]] and animator.Y == [[0.5, 0.25]]
    assert capsys.readouterr().out.splitlines() == ['epoch 1: loss 0.5', 'epoch 2: loss 0.25']


def test_animator_refuses_more_lines_than_formats():
    animator = d2lpar.Animator(fmts=('-', 'r:'))
    with pytest.raises(ValueError, match='3 lines but only 2 formats'):
        animator.add(1, [1, 2, 3])


@pytest.mark.parametrize('bad', [0, -1, '2', 2.0])
def test_accumulator_bad_size(bad):
    with pytest.raises(ValueError, match='positive int n'):
        d2lpar.Accumulator(bad)


def test_animator_keeps_d2l_signature():
    import inspect

    names = list(inspect.signature(d2lpar.Animator).parameters)
    # d2l.Animator's parameters, in d2l's order (title is ours, last).
    assert names[:10] == ['xlabel', 'ylabel', 'legend', 'xlim', 'ylim', 'xscale', 'yscale', 'fmts', 'nrows', 'ncols']
    assert names[10] == 'figsize'
    # d2l keeps a list of axes (and draws only in the first: ours refuses a second subplot)
    assert len(d2lpar.Animator(nrows=1, ncols=1).axes) == 1
    with pytest.raises(ValueError, match='nrows must be a positive int'):
        d2lpar.Animator(nrows=0)


@pytest.mark.parametrize(
    'x, y, message',
    [
        (1, 'abc', "y must be numbers .* got 'abc'"),
        ('a', 1.0, "x must be numbers .* got 'a'"),
        (1, [1.0, object()], 'y must be numbers'),
        (1, True, 'y must be numbers'),
    ],
)
def test_animator_add_refuses_what_is_not_a_number(x, y, message):
    with pytest.raises(TypeError, match=message):
        d2lpar.Animator().add(x, y)


@pytest.mark.parametrize('device', ['gpu', 3.5, 'cuda:x', True, -1])
def test_timer_names_a_bad_device(device):
    with pytest.raises(ValueError, match="Timer: device must be None"):
        d2lpar.Timer(device=device)
