"""trainer/batching.py: token-budget packing (verl's use_dynamic_bsz), as properties."""

from hypothesis import given
from hypothesis import strategies as st

from grpo_tune.trainer.batching import count, pack

lengths_st = st.lists(st.integers(1, 64), min_size=0, max_size=40)


@given(lengths_st, st.integers(64, 256), st.integers(1, 12), st.sampled_from([1, 2, 4]))
def test_pack_covers_every_row_once_within_budget(lengths, budget, min_count, multiple):
    groups = pack(lengths, budget, min_count=min_count, multiple=multiple)
    rows = sorted(i for g in groups for i in g)
    assert rows == list(range(len(lengths)))  # every row exactly once
    assert len(groups) >= max(min_count, 1) and len(groups) % multiple == 0
    for g in groups:
        assert sum(lengths[i] for i in g) <= budget  # a longest row (<= 64) always fits alone here


@given(lengths_st, st.integers(64, 256))
def test_greedy_count_is_close_to_the_lower_bound(lengths, budget):
    n = count(lengths, budget)
    lower = -(-sum(lengths) // budget)
    assert max(lower, 1) <= n <= 2 * max(lower, 1)  # first-fit decreasing never uses 2x the bins


def test_sorted_packing_groups_similar_lengths():
    assert pack([10, 3, 9, 2, 8, 1], 20) == [[0, 2, 5], [1, 3, 4]]
