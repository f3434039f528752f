"""`sglang_domino.sglang.cpu.parallel`: how CPU ranks share cores, in process."""

import pytest

from sglang_domino.sglang.cpu import parallel as cp


def test_cores_are_split_contiguously_and_the_bind_string_round_trips():
    assert cp.split_cores([3, 0, 1, 2], 2) == [[0, 1], [2, 3]]
    assert cp.split_cores([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert cp.split_cores([0, 1], 2) == [[0], [1]]
    groups = cp.split_cores(list(range(8)), 3)
    assert sorted(c for g in groups for c in g) == list(range(8)) and [len(g) for g in groups] == [3, 3, 2]
    text = cp.bind_string(groups)
    assert text == "0,1,2|3,4,5|6,7"
    assert [cp.parse_cores(part) for part in text.split("|")] == groups
    assert cp.parse_cores("0-3,8") == [0, 1, 2, 3, 8] and cp.parse_cores([4, 5]) == [4, 5]


def test_more_ranks_than_cores_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r"= 4 ranks on CPU needs a core per rank; this process may use 2 \(\[0, 1\]"):
        cp.split_cores([0, 1], 4)


def test_each_node_splits_its_own_cores_among_its_own_ranks():
    # one node, TP 2 on two cores: one core each
    assert cp.node_binding(2, 1, [0, 1], numa_nodes=1) == "0|1"
    # two nodes (multi-node TP 2), one rank each: that rank gets all of its node's cores,
    # not the first share of a split made for the global count
    assert cp.node_binding(2, 2, [0, 1], numa_nodes=1) == "0,1"
    assert cp.node_binding(4, 2, [0, 1, 2, 3], numa_nodes=1) == "0,1|2,3"
    # upstream binds by itself: one rank, or a NUMA node per rank
    assert cp.node_binding(1, 1, [0, 1], numa_nodes=1) is None
    assert cp.node_binding(2, 1, [0, 1], numa_nodes=2) is None
    with pytest.raises(ValueError, match="--nnodes 2 does not divide the 3 ranks"):
        cp.node_binding(3, 2, [0, 1], numa_nodes=1)


def test_groups_get_gloo_only_unless_the_caller_chose():
    seen = {}

    def original(*args, **kwargs):
        seen.update(kwargs)

    cp.around_init_model_parallel_group(original, [[0, 1]], 0, "gloo", group_name="tp")
    assert seen["use_pynccl"] is False and seen["use_custom_allreduce"] is False
    cp.around_init_model_parallel_group(original, [[0, 1]], 0, "gloo", use_pynccl=True)
    assert seen["use_pynccl"] is True
