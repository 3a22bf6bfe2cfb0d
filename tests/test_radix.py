"""The token-prefix tree behind topas.trace/2's segments: a node boundary wherever two prompts
diverge or one ends (and at every cut), so two prompts share exactly the tokens of the leading
nodes their paths share."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from topas.workload.radix import RadixTree, node_id, reuse_of_sequences

seqs_st = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=8)


def lcp(a, b) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def shared_tokens(pa, pb) -> int:
    n = 0
    for x, y in zip(pa, pb):
        if x is not y:
            break
        n += x.length
    return n


@settings(max_examples=100, deadline=None)
@given(seqs_st, st.data())
def test_paths_spell_the_sequences_and_share_exactly_their_common_prefix(seqs, data):
    tree = RadixTree(seqs)
    for k, s in enumerate(seqs):  # cuts never change what is shared
        if len(s) > 1:
            tree.cut(k, data.draw(st.integers(1, len(s) - 1)))
    paths = [tree.path(k) for k in range(len(seqs))]
    for k, s in enumerate(seqs):
        assert [t for n in paths[k] for t in tree.node_tokens(n)] == s
    for i in range(len(seqs)):
        for j in range(len(seqs)):
            assert shared_tokens(paths[i], paths[j]) == lcp(seqs[i], seqs[j])


@settings(max_examples=100, deadline=None)
@given(seqs_st)
def test_reuse_is_the_longest_prefix_shared_with_an_earlier_sequence(seqs):
    want = [max([lcp(s, seqs[j]) for j in range(k)], default=0) for k, s in enumerate(seqs)]
    assert reuse_of_sequences(seqs) == want


def test_a_cut_puts_a_boundary_and_node_ids_chain():
    tree = RadixTree([[1, 2, 3, 4], [1, 2, 5]])
    assert [n.length for n in tree.path(0)] == [2, 2]  # split where the two diverge
    tree.cut(0, 3)
    assert [n.length for n in tree.path(0)] == [2, 1, 1]
    assert [n.length for n in tree.path(1)] == [2, 1]
    # an id names the whole prefix: the same tokens under another parent get another id
    assert node_id("", [5]) != node_id(node_id("", [1, 2]), [5])
    assert node_id("a", [1, 2]) == node_id("a", [1, 2])
