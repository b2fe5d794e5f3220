"""d2lpar.write_next: a script's next version from the last one plus the diff a notebook shows."""

import difflib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d2lpar.machinery.saving import apply_diff, write_next

LINES = st.lists(st.sampled_from(['a', 'b', 'c', '', 'def f():', '    return 1']), max_size=12)


def unified(old, new, n=2):
    return ''.join(difflib.unified_diff([x + '\n' for x in old], [x + '\n' for x in new], n=n))


@settings(max_examples=300, deadline=None)
@given(LINES, LINES, st.integers(0, 3))
def test_applies_what_difflib_prints(old, new, n):
    diff = unified(old, new, n)
    if diff:
        assert apply_diff(''.join(x + '\n' for x in old), diff) == ''.join(x + '\n' for x in new)


def test_a_hunk_that_does_not_match_is_refused():
    diff = unified(['a', 'b', 'c'], ['a', 'B', 'c'])
    with pytest.raises(ValueError, match='apply_diff: hunk .* does not match'):
        apply_diff('a\nx\nc\n', diff)
    shifted = diff.replace('@@ -1,3 +1,3 @@', '@@ -2,3 +2,3 @@')
    with pytest.raises(ValueError, match='does not match the file at line 2'):
        apply_diff('a\nb\nc\n', shifted)


def test_bad_diffs_are_named():
    with pytest.raises(ValueError, match='holds no hunk'):
        apply_diff('a\n', '')
    with pytest.raises(ValueError, match='must start with a hunk header'):
        apply_diff('a\n', '-a\n+b\n')
    with pytest.raises(ValueError, match='hunk header reads'):
        apply_diff('a\n', '@@ 1 @@\n-a\n+b\n')
    with pytest.raises(ValueError, match="start with ' ', '-' or '\\+'"):
        apply_diff('a\n', '@@ -1 +1 @@\n-a\n*b\n')


def test_write_next_writes_the_new_version_and_leaves_nothing_on_error(tmp_path, capsys):
    (tmp_path / 'v1.py').write_text('x = 1\nprint(x)\n')
    write_next(tmp_path / 'v1.py', tmp_path / 'v2.py', '@@ -1,2 +1,3 @@\n x = 1\n+x += 1\n print(x)\n')
    assert (tmp_path / 'v2.py').read_text() == 'x = 1\nx += 1\nprint(x)\n'
    assert '1 lines added, 0 removed (3 lines)' in capsys.readouterr().out
    with pytest.raises(ValueError, match='does not match'):
        write_next(tmp_path / 'v1.py', tmp_path / 'v3.py', '@@ -1,1 +1,1 @@\n-y = 1\n+y = 2\n')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['v1.py', 'v2.py']
    with pytest.raises(ValueError, match='write_next: .* does not exist'):
        write_next(tmp_path / 'v0.py', tmp_path / 'v3.py', '@@ -1 +1 @@\n-a\n+b\n')
