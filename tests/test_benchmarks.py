"""make bench's choices that depend on the machine, checked without its GPUs."""
from benchmarks.methods import data_parallel_processes


def test_the_data_parallel_rows_use_a_process_count_that_splits_the_batch():
    got = {gpus: data_parallel_processes(gpus, 256) for gpus in range(9)}
    # no GPU or one: two CPU slots; 3, 5, 6, 7 GPUs: the most that divide 256
    assert got == {0: 2, 1: 2, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 4, 8: 8}
    assert all(256 % k == 0 for k in got.values())
    assert data_parallel_processes(6, 96) == 6 and data_parallel_processes(3, 255) == 3
    assert data_parallel_processes(2, 7) == 1  # nothing divides it: one process
