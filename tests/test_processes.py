"""Every launcher takes a child's environment the same way (d2lpar.machinery.processes.environment)."""

import pytest

import d2lpar
from d2lpar.machinery.processes import environment

GOOD = [None, {}, {'OMP_NUM_THREADS': 1}, {'A': 'x', 'B': 2.5, 'C': None}]
BAD = [
    (('A=1',), TypeError),
    ({'A=B': '1'}, ValueError),
    ({'': '1'}, ValueError),
    ({1: '1'}, ValueError),
    ({'A': object()}, TypeError),
    ({'A': True}, TypeError),
    ({'A': [1]}, TypeError),
]


@pytest.mark.parametrize('env', GOOD)
def test_good_environments_become_strings_or_unset(env):
    assert environment(env) == {k: None if v is None else str(v) for k, v in (env or {}).items()}


@pytest.mark.parametrize('env, error', BAD)
def test_launch_and_run_with_mask_refuse_the_same_environments_alike(env, error, tmp_path):
    script = tmp_path / 'nothing.py'
    script.write_text('')
    with pytest.raises(error) as from_launch:
        d2lpar.launch(script, nproc=1, env=env)
    with pytest.raises(error) as from_mask:
        d2lpar.run_with_mask('0', script=script, env=env)
    assert str(from_launch.value) == str(from_mask.value)


def test_run_with_mask_takes_numbers_and_unsets_as_launch_does(monkeypatch):
    monkeypatch.setenv('D2LPAR_TEST_UNSET_ME', 'x')
    code = (
        "import os\nreport['threads'] = os.environ['OMP_NUM_THREADS']\n"
        "report['unset'] = 'D2LPAR_TEST_UNSET_ME' in os.environ\n"
    )
    run = d2lpar.run_with_mask('0', code=code, env={'OMP_NUM_THREADS': 3, 'D2LPAR_TEST_UNSET_ME': None})
    assert run['report'] == {'threads': '3', 'unset': False}


def test_launch_and_run_with_mask_give_a_child_the_same_environment(monkeypatch, tmp_path):
    # One env value, two launchers, real children: a number arrives as its string, None unsets.
    monkeypatch.setenv('D2LPAR_TEST_UNSET_ME', 'x')
    monkeypatch.delenv('D2LPAR_RESULT_DIR', raising=False)
    script = tmp_path / 'probe.py'
    script.write_text(
        "import os\nfrom d2lpar.distributed import emit_result\n"
        "emit_result(threads=os.environ.get('OMP_NUM_THREADS'),\n"
        "            unset='D2LPAR_TEST_UNSET_ME' not in os.environ)\n"
    )
    env = {'OMP_NUM_THREADS': 3, 'D2LPAR_TEST_UNSET_ME': None}
    [launched] = d2lpar.launch(script, nproc=1, env=env, echo=False).check().results
    assert (launched['threads'], launched['unset']) == ('3', True)
    masked = d2lpar.run_with_mask('0', script=script, env=env)
    assert "threads='3', unset=True" in masked['stdout'], masked
