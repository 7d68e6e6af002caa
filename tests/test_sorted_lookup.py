"""SortedLookup answers what np.searchsorted answers, through its fence."""
import numpy as np
import pytest

from ritrag.sorted_lookup import FENCE_STRIDE, SortedLookup


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_positions_and_find_equal_searchsorted(dtype):
    rng = np.random.default_rng(7)
    for n in (0, 1, 2, FENCE_STRIDE - 1, FENCE_STRIDE, FENCE_STRIDE + 1, 5 * FENCE_STRIDE, 3001):
        # few distinct values: runs of equal entries across block edges
        values = np.sort(rng.integers(0, max(n // 3, 1) + 1, n)).astype(dtype)
        asked = rng.integers(0, max(n // 3, 1) + 3, 400).astype(dtype)
        lookup = SortedLookup(values)
        at = np.searchsorted(values, asked)
        assert (lookup.positions(asked) == at).all()
        present = (at < n) & (values[np.minimum(at, max(n - 1, 0))] == asked) if n else np.zeros(len(asked), bool)
        assert (lookup.find(asked) == np.where(present, at, -1)).all()


def test_extremes_of_uint64_keys():
    top = np.iinfo(np.uint64).max
    values = np.array([0, 1, 2**63, top - 1, top], np.uint64)
    lookup = SortedLookup(values)
    asked = np.array([top, 0, 2**63 + 1, top - 1, 3], np.uint64)
    assert lookup.positions(asked).tolist() == np.searchsorted(values, asked).tolist()
    assert lookup.find(asked).tolist() == [4, 0, -1, 3, -1]


def test_an_empty_batch_and_an_empty_array():
    assert SortedLookup(np.arange(10, dtype=np.int64)).find(np.zeros(0, np.int64)).tolist() == []
    assert SortedLookup(np.zeros(0, np.int64)).find(np.array([1, 2], np.int64)).tolist() == [-1, -1]
