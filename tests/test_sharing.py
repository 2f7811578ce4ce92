"""The prefix tree that finds, for each prompt, the earlier prompt it shares most with."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixtop.incident.replay.sharing import longest_earlier_prefixes


def brute(prompts: list) -> list[tuple[int, int]]:
    out = []
    for i, p in enumerate(prompts):
        best, owner = 0, -1
        for j in range(i):
            k = 0
            while k < min(len(p), len(prompts[j])) and p[k] == prompts[j][k]:
                k += 1
            if k > best:
                best, owner = k, j
        out.append((owner, best))
    return out


def shared(a, b) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


# Few distinct tokens, so that prompts share, part inside edges, and end inside others.
prompts = st.lists(st.lists(st.integers(0, 3), max_size=12).map(tuple), max_size=25)


@settings(max_examples=300, deadline=None)
@given(prompts)
def test_the_tree_finds_the_longest_share_with_an_earlier_prompt(seqs) -> None:
    got = longest_earlier_prefixes(seqs)
    want = brute(seqs)
    for i, ((owner, length), (_, best)) in enumerate(zip(got, want, strict=True)):
        assert length == best, (i, seqs)
        assert (owner == -1) == (best == 0) and (owner < i)
        if owner >= 0:
            assert shared(seqs[i], seqs[owner]) == best  # the one it names shares all of it


def test_text_and_a_conversation_tree() -> None:
    system = "You are a careful assistant. "
    chats = [system + "Q1", system + "Q2", system + "Q1 A1 Q3", "other", system + "Q1 A1 Q3 A3"]
    assert longest_earlier_prefixes(chats) == [(-1, 0), (0, len(system) + 1), (0, len(system) + 2), (-1, 0),
                                               (2, len(chats[2]))]
