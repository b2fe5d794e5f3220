"""make bench's choices that depend on the machine, checked without its GPUs."""

from pathlib import Path

from benchmarks.methods import data_parallel_processes
from full_disk import run_on_a_full_disk

ROOT = Path(__file__).resolve().parent.parent


def test_the_data_parallel_rows_use_a_process_count_that_splits_the_batch():
    got = {gpus: data_parallel_processes(gpus, 256) for gpus in range(9)}
    # no GPU or one: two CPU slots; 3, 5, 6, 7 GPUs: the most that divide 256
    assert got == {0: 2, 1: 2, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 4, 8: 8}
    assert all(256 % k == 0 for k in got.values())
    assert data_parallel_processes(6, 96) == 6 and data_parallel_processes(3, 255) == 3
    assert data_parallel_processes(2, 7) == 1  # nothing divides it: one process


def test_results_are_written_whole_or_not_at_all(tmp_path):
    # The previous run's files stay as they were when the disk fills halfway through the new
    # ones, and no temporary file is left beside them.
    (tmp_path / 'demo.json').write_text('{"old": true}')
    (tmp_path / 'demo.png').write_bytes(b'old picture')
    done = run_on_a_full_disk(
        f"""
        from pathlib import Path
        from matplotlib.figure import Figure
        from benchmarks._results import save
        folder = Path({str(tmp_path)!r})
        fig = Figure()
        fig.add_subplot().plot(range(100))
        full_disk()
        for record in ({{'timings': list(range(1000))}}, {{}}):  # the JSON fails, then the picture
            try:
                save('demo', record, fig, folder=folder)
            except OSError as e:
                print('raised', e.errno, (folder / 'demo.json').read_text())
        """,
        limit=512,
        cwd=ROOT,
    )
    said = done.stdout.splitlines()
    assert [line.split(' ', 2)[2] for line in said] == ['{"old": true}', '{}'], done.stdout + done.stderr
    assert (tmp_path / 'demo.png').read_bytes() == b'old picture'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['demo.json', 'demo.png']
