import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from streamtrace.algo.ids import MAX_SAFE_ID, check_id_space, existing_multiplier, id_multiplier, rank_unique_id


def test_multiplier_is_a_power_of_ten_above_every_raw_id():
    assert id_multiplier(0) == 10**9
    assert id_multiplier(10**9 - 1) == 10**9
    assert id_multiplier(10**9) == 10**10


@given(
    st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 10**11)), min_size=2, max_size=50),
)
def test_ids_are_unique_across_ranks_and_keep_the_raw_id(pairs):
    multiplier = id_multiplier(max(raw for _, raw in pairs))
    ids = {rank_unique_id(rank, raw, multiplier): (rank, raw) for rank, raw in pairs}
    assert len(ids) == len(set(pairs))
    for new_id, (rank, raw) in ids.items():
        assert new_id % multiplier == raw
        assert new_id // multiplier == rank + 1
        assert new_id <= MAX_SAFE_ID


def test_id_space_overflow_is_reported():
    assert check_id_space(1023, 10**9) is None
    assert "2^53" in check_id_space(10**7, 10**9)


@given(st.lists(st.tuples(st.integers(0, 63), st.integers(0, 10**10)), min_size=1, max_size=50))
def test_rank_unique_ids_are_recognised_and_raw_ids_are_not(pairs):
    multiplier = id_multiplier(max(raw for _, raw in pairs))
    ranks = np.array([rank for rank, _ in pairs], dtype=np.int32)
    unique = np.array([rank_unique_id(rank, raw, multiplier) for rank, raw in pairs], dtype=np.int64)
    assert existing_multiplier(unique, ranks) == multiplier
    # an event of no known rank keeps its raw id: it does not hide the others' form
    assert existing_multiplier(np.append(unique, 7), np.append(ranks, -1)) == multiplier
    assert existing_multiplier(unique, (ranks + 1) % 64) is None  # each id claimed by another rank
    assert existing_multiplier(unique, np.full(len(pairs), -1, dtype=np.int32)) is None
    raw = np.array([raw for _, raw in pairs], dtype=np.int64)
    if (raw < 10**9).all():  # raw ids as profilers number them never read as rank-unique
        assert existing_multiplier(raw, ranks) is None
