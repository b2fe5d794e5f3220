"""Fashion-MNIST loading: the stand-in, file checks, atomic writes and fallbacks."""

import os
import subprocess
import sys

import pytest
import torch
import torchvision

import d2lpar
from d2lpar import data, data_files


@pytest.fixture(scope='module')
def standin_root(tmp_path_factory):
    """A data root holding a generated stand-in, made once for this module."""
    root = tmp_path_factory.mktemp('data')
    data._prepare_standin(root)
    return root


def raw_of(root):
    return root / 'standin' / 'FashionMNIST' / 'raw'


def copy_root(src, dst):
    (raw_of(dst)).mkdir(parents=True)
    for f in raw_of(src).iterdir():
        if not f.name.startswith('.'):
            (raw_of(dst) / f.name).write_bytes(f.read_bytes())
    return dst


def test_loader_shapes_and_dtypes(standin_root, capsys):
    train_iter, test_iter = d2lpar.load_data_fashion_mnist(256, root=standin_root)
    assert 'STAND-IN' in capsys.readouterr().err
    X, y = next(iter(train_iter))
    assert X.shape == (256, 1, 28, 28) and X.dtype == torch.float32
    assert y.shape == (256,) and y.dtype == torch.int64
    assert 0 <= float(X.min()) and float(X.max()) <= 1
    assert len(train_iter) == 235 and len(test_iter) == 40
    assert len(train_iter.dataset) == 60000 and len(test_iter.dataset) == 10000  # as d2l asks
    assert torch.equal(test_iter.dataset[3][0], test_iter.X[3])
    assert sum(len(y) for _, y in train_iter) == 60000
    assert sum(len(y) for _, y in test_iter) == 10000
    assert set(torch.cat([y for _, y in test_iter]).tolist()) == set(range(10))


def test_warning_is_printed_every_time(standin_root, capsys):
    for _ in range(2):
        d2lpar.load_data_fashion_mnist(256, root=standin_root)
    assert capsys.readouterr().err.count('Using the generated Fashion-MNIST STAND-IN') == 2


def test_torchvision_reads_the_standin(standin_root):
    ds = torchvision.datasets.FashionMNIST(standin_root / 'standin', train=False)
    assert ds.data.shape == (10000, 28, 28) and ds.data.dtype == torch.uint8
    assert ds.targets.shape == (10000,)


def test_resize(standin_root):
    train_iter, _ = d2lpar.load_data_fashion_mnist(8, resize=32, root=standin_root)
    X, _ = next(iter(train_iter))
    assert X.shape == (8, 1, 32, 32)


def test_generation_is_deterministic(standin_root, tmp_path):
    data_files.make_standin(tmp_path)
    manifest = data_files.MANIFEST
    assert (tmp_path / manifest).read_text() == (raw_of(standin_root) / manifest).read_text()


@pytest.mark.parametrize('damage', ['truncate', 'flip a byte', 'delete', 'bad magic'])
def test_damaged_standin_is_regenerated(standin_root, tmp_path, capsys, damage):
    root = copy_root(standin_root, tmp_path)
    victim = raw_of(root) / 'train-images-idx3-ubyte'
    original = victim.read_bytes()
    if damage == 'truncate':
        victim.write_bytes(original[:1000])
    elif damage == 'flip a byte':
        victim.write_bytes(original[:5000] + bytes([original[5000] ^ 0xFF]) + original[5001:])
    elif damage == 'delete':
        victim.unlink()
    else:
        victim.write_bytes(b'\x00\x00\x08\x01' + original[4:])
    assert data_files._standin_problem(raw_of(root)) is not None
    d2lpar.load_data_fashion_mnist(256, root=root)
    assert 'Regenerating' in capsys.readouterr().err
    assert victim.read_bytes() == original
    assert data_files._standin_problem(raw_of(root)) is None


def fake_real(standin_root, root):
    """Put files that pass every offline check of the real data set under `root`."""
    real = root / 'FashionMNIST' / 'raw'
    real.mkdir(parents=True)
    for name in data_files.FILES:
        payload = (raw_of(standin_root) / name).read_bytes()
        if name in data_files.PER_CLASS:  # balanced labels, as the real data set has
            payload = payload[:8] + bytes(i % 10 for i in range(len(payload) - 8))
        (real / name).write_bytes(payload)
    return real


def test_real_files_are_preferred(standin_root, tmp_path, capsys):
    fake_real(standin_root, tmp_path)
    train_iter, _ = d2lpar.load_data_fashion_mnist(256, root=tmp_path)
    assert 'STAND-IN' not in capsys.readouterr().err
    assert not (tmp_path / 'standin').exists()
    assert d2lpar.fashion_mnist_source(tmp_path).startswith('real Fashion-MNIST in')


def test_failed_download_falls_back_and_leaves_nothing(tmp_path, monkeypatch, capsys, standin_root):
    monkeypatch.setenv('D2LPAR_OFFLINE', '0')
    calls = []

    def no_network(root, train=True, download=False, **kwargs):
        calls.append((root, download))
        partial = os.path.join(root, 'FashionMNIST', 'raw')
        os.makedirs(partial, exist_ok=True)
        with open(os.path.join(partial, 'train-images-idx3-ubyte'), 'wb') as f:
            f.write(b'half a file')  # what an interrupted download leaves
        raise RuntimeError('Error downloading train-images-idx3-ubyte.gz: no network')

    monkeypatch.setattr(torchvision.datasets, 'FashionMNIST', no_network)
    monkeypatch.setattr(data, '_prepare_standin', lambda root: raw_of(standin_root))
    monkeypatch.setattr(
        data, '_read', lambda raw, train: (torch.zeros(4, 1, 28, 28), torch.zeros(4, dtype=torch.int64))
    )
    d2lpar.load_data_fashion_mnist(2, root=tmp_path)
    err = capsys.readouterr().err
    assert calls and calls[0][1] is True
    assert 'the download failed (RuntimeError: Error downloading' in err
    leftovers = [p for p in tmp_path.rglob('*') if p.is_file() and p.name != '.lock']
    assert leftovers == [], leftovers


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / 'file.bin'
    target.write_bytes(b'old')

    def crash(src, dst):
        raise OSError('disk full')

    monkeypatch.setattr(os, 'replace', crash)
    with pytest.raises(OSError, match='disk full'):
        data_files._atomic_write(target, b'new contents')
    assert target.read_bytes() == b'old'
    assert [p.name for p in tmp_path.iterdir()] == ['file.bin']


def test_two_processes_prepare_at_once(tmp_path):
    code = 'import sys, pathlib, d2lpar.data as d; d._prepare_standin(pathlib.Path(sys.argv[1]))'
    procs = [
        subprocess.Popen([sys.executable, '-c', code, str(tmp_path)], stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert data_files._standin_problem(raw_of(tmp_path)) is None
    assert not [p for p in raw_of(tmp_path).iterdir() if p.name.endswith('.tmp')]


def test_tensor_loader_order():
    X, y = torch.arange(10.0).reshape(10, 1), torch.arange(10)
    loader = d2lpar.TensorLoader(X, y, 4)
    assert [b.tolist() for _, b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    shuffled = d2lpar.TensorLoader(X, y, 4, shuffle=True)
    torch.manual_seed(0)
    first = torch.cat([b for _, b in shuffled])
    torch.manual_seed(0)
    again = torch.cat([b for _, b in shuffled])
    assert sorted(first.tolist()) == list(range(10))
    assert torch.equal(first, again) and not torch.equal(first, y)
    for Xb, yb in shuffled:
        assert torch.equal(Xb[:, 0].long(), yb)


@pytest.mark.parametrize('bad', [0, -3, 2.5, None])
def test_tensor_loader_bad_batch_size(bad):
    with pytest.raises(ValueError, match='positive int'):
        d2lpar.TensorLoader(torch.ones(3, 1), torch.ones(3), bad)
    with pytest.raises(ValueError, match='positive int'):
        d2lpar.load_data_fashion_mnist(bad)


def test_standin_is_learnable_but_not_trivial(standin_root):
    """One epoch of LeNet: far above chance (10%), but not perfect."""
    torch.manual_seed(0)
    train_iter, test_iter = d2lpar.load_data_fashion_mnist(256, root=standin_root)
    params = d2lpar.get_params(d2lpar.init_lenet_params(seed=0), 'cpu')
    optimizer = torch.optim.SGD(params, lr=0.2)
    for X, y in train_iter:
        loss = torch.nn.functional.cross_entropy(d2lpar.lenet(X, params), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    acc = d2lpar.evaluate_accuracy_gpu(lambda X: d2lpar.lenet(X, params), test_iter)
    assert 0.5 < acc < 0.97, acc


@pytest.mark.parametrize('bad', [-3, 0, 'a', (28,), (28, 0), 2.5, True])
def test_tensor_loader_bad_resize(bad):
    X, y = torch.zeros(4, 1, 28, 28), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match='resize must be None, a positive int'):
        data.TensorLoader(X, y, 2, resize=bad)


def test_text_labels():
    assert d2lpar.get_fashion_mnist_labels(torch.tensor([0, 9])) == ['t-shirt', 'ankle boot']
    for bad in ([-1], [10]):
        with pytest.raises(ValueError, match=r'labels are 0\.\.9'):
            d2lpar.get_fashion_mnist_labels(bad)


@pytest.mark.parametrize(
    'damage, why',
    [
        ('labels', 'has [6001, 5999, 6000'),
        ('range', 'holds labels outside 0..9'),
        ('archive', 'does not match the MD5 torchvision records'),
    ],
)
def test_a_damaged_real_file_is_named_when_the_standin_is_used(standin_root, tmp_path, capsys, damage, why):
    real = fake_real(standin_root, tmp_path)
    labels = real / 'train-labels-idx1-ubyte'
    body = bytearray(labels.read_bytes())
    if damage == 'labels':  # header and size intact, the body not Fashion-MNIST's
        body[9] = 0
    elif damage == 'range':
        body[9] = 200
    else:
        (real / 'train-labels-idx1-ubyte.gz').write_bytes(b'not the archive')
    labels.write_bytes(bytes(body))
    problem = data._real_problem(real)
    assert problem is not None and why in problem
    assert not d2lpar.fashion_mnist_source(tmp_path).startswith('real Fashion-MNIST in')
    data.prepare_fashion_mnist(tmp_path)  # offline under the test suite: the stand-in
    err = capsys.readouterr().err
    assert 'STAND-IN' in err and f'unusable: {problem}' in err


def test_what_an_interrupted_writer_left_is_removed(standin_root, tmp_path, capsys):
    root = copy_root(standin_root, tmp_path)
    leftover = raw_of(root) / '.train-images-idx3-ubyte.x1y2.tmp'
    leftover.write_bytes(b'\0' * 1000)  # what a writer killed mid-write leaves
    download = tmp_path / 'FashionMNIST' / '.download-abc'
    (download / 'FashionMNIST' / 'raw').mkdir(parents=True)
    data.prepare_fashion_mnist(tmp_path)
    err = capsys.readouterr().err
    assert not leftover.exists() and not download.exists()
    assert 'Removed what an interrupted write left' in err and leftover.name in err
    assert data_files._standin_problem(raw_of(root)) is None


def test_leftovers_of_a_writer_at_work_are_kept(tmp_path):
    import fcntl

    folder = tmp_path / 'standin' / 'FashionMNIST'
    (folder / 'raw').mkdir(parents=True)
    busy = folder / 'raw' / '.t10k-images-idx3-ubyte.abc.tmp'
    busy.write_bytes(b'half')
    with open(folder / '.lock', 'w') as f:  # another process holds the lock: it is writing
        fcntl.flock(f, fcntl.LOCK_EX)
        code = 'import sys, pathlib, d2lpar.data as d; print(d._remove_leftovers(pathlib.Path(sys.argv[1])))'
        out = subprocess.run(
            [sys.executable, '-c', code, str(folder)], capture_output=True, text=True, timeout=120
        ).stdout
    assert out.strip() == '[]' and busy.exists()
