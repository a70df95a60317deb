import time

import pytest

from tinker_cookbook.utils import misc_utils


def test_timed_records_seconds_under_time_prefix():
    metrics: dict[str, float] = {}
    with misc_utils.timed("phase", metrics):
        time.sleep(0.02)
    assert 0.015 < metrics["time/phase"] < 1.0


def test_timed_records_even_when_the_body_raises():
    metrics: dict[str, float] = {}
    with pytest.raises(RuntimeError), misc_utils.timed("broken", metrics):
        raise RuntimeError("boom")
    assert "time/broken" in metrics


def test_dict_mean_averages_each_key_over_the_dicts_that_have_it():
    # a: (1 + 3) / 2 = 2; b only in the first dict: 10 (a missing key is not a zero).
    assert misc_utils.dict_mean([{"a": 1, "b": 10}, {"a": 3}]) == {"a": 2.0, "b": 10.0}
    assert misc_utils.dict_mean([]) == {}


def test_safezip_pairs_and_rejects_length_mismatch():
    assert misc_utils.safezip([1, 2], ["a", "b"]) == [(1, "a"), (2, "b")]
    with pytest.raises(ValueError, match=r"\[2, 3\]"):
        misc_utils.safezip([1, 2], [1, 2, 3])


def test_split_list_sizes_differ_by_at_most_one():
    assert misc_utils.split_list(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert misc_utils.split_list([1, 2], 2) == [[1], [2]]
    with pytest.raises(ValueError, match="num_parts=3"):
        misc_utils.split_list([1, 2], 3)
    with pytest.raises(ValueError, match="num_parts=0"):
        misc_utils.split_list([1, 2], 0)


def test_small_helpers():
    assert misc_utils.all_same([1, 1, 1]) and not misc_utils.all_same([1, 2]) and misc_utils.all_same([])
    assert misc_utils.concat_lists([[1, 2], [], [3]]) == [1, 2, 3]
    assert misc_utils.not_none(0) == 0
    with pytest.raises(ValueError):
        misc_utils.not_none(None)
    assert misc_utils.lookup_func("math:sqrt")(9.0) == 3.0
    assert misc_utils.lookup_func("sqrt", default_module="math")(4.0) == 2.0
    with pytest.raises(ValueError, match="no attribute"):
        misc_utils.lookup_func("math:nope")


def test_iteration_dir_is_created(tmp_path):
    path = misc_utils.iteration_dir(tmp_path, 7)
    assert path == tmp_path / "iteration_000007" and path.is_dir()
