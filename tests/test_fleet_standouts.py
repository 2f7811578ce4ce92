"""Which ranks stand out (session/fleet.py), and how Prometheus's answers fold into ranks
(probes/fleet.py): the rules one by one, on typed records."""

from __future__ import annotations

from radixtop.probes.fleet import FleetSample, RankFigures, fold, node_of
from radixtop.probes.prometheus import Labels, QueryAnswer, Series
from radixtop.probes.status import SourceState
from radixtop.session.fleet import FleetState, open_command, standouts
from radixtop.widgets.fleet import render_fleet


def rank(node: str, r: int, **figures: float | str | None) -> RankFigures:
    base = dict(capacity=1000.0, available=600.0, evictable=0.0, locked=50.0, evictions=3.0, negative_lock_ref=0.0,
                lock_failures=0.0, unlock_failures=0.0, nodes_below_zero=0.0, hooks_active=1.0)
    base.update(figures)
    return RankFigures(node=node, rank=str(r), instance=f"{node}:{9000 + r}", job="sglang",
                       scrape=base.pop("scrape", "up"), **base)  # type: ignore[arg-type]


def flagged(ranks: list[RankFigures]) -> dict[tuple[str, str], tuple[str, ...]]:
    return {(s.rank.node, s.rank.rank): s.reasons for s in standouts(ranks)}


def test_a_fleet_alike_has_nothing_standing_out() -> None:
    assert flagged([rank("a", i) for i in range(4)]) == {}


def test_token_usage_far_from_the_median_stands_out_with_three_ranks_or_more() -> None:
    ranks = [rank("a", 0), rank("a", 1), rank("b", 0, available=20.0)]
    assert flagged(ranks) == {("b", "0"): ("token usage 0.98, the fleet's median 0.40",)}
    assert flagged(ranks[1:]) == {}  # two ranks: no majority to be far from


def test_evictable_tokens_count_as_free_in_token_usage() -> None:
    assert rank("a", 0, available=100.0, evictable=500.0).usage == 0.4


def test_locked_tokens_far_above_the_median_stand_out_and_far_below_do_not() -> None:
    ranks = [rank("a", 0), rank("a", 1), rank("a", 2), rank("b", 0, locked=400.0), rank("b", 1, locked=0.0)]
    assert flagged(ranks) == {("b", "0"): ("400 tokens locked (40% of the pool), the fleet's median 5%",)}


def test_lock_anomalies_a_scrape_down_and_hooks_off_stand_out_heaviest_first() -> None:
    ranks = [
        rank("a", 0, hooks_active=0.0),
        rank("a", 1, scrape="down", capacity=None, available=None),
        rank("b", 0, scrape="gone"),
        rank("b", 1, negative_lock_ref=2.0, nodes_below_zero=1.0, lock_failures=1.0, unlock_failures=3.0),
    ]
    found = standouts(ranks)
    assert [(s.rank.node, s.rank.rank) for s in found] == [("b", "1"), ("a", "1"), ("b", "0"), ("a", "0")]
    assert found[0].reasons == ("2 unlocks left lock_ref below zero", "1 tree node with lock_ref < 0",
                                "1 lock call raised", "3 unlock calls raised")
    assert found[1].reasons == ("Prometheus's scrape of a:9001 is down (up == 0)",)
    assert found[2].reasons == ("Prometheus no longer scrapes b:9000 (seen within the hour)",)
    assert found[3].reasons == ("radixtop's hooks are off on it: its lock figures are not counted",)
    assert found[0].rank.lock_anomalies == 6.0
    assert found[0].command == "radixtop --node b"


def test_a_rank_that_is_down_is_not_compared_to_the_median() -> None:
    ranks = [rank("a", 0), rank("a", 1), rank("a", 2), rank("b", 0, scrape="down", available=0.0)]
    assert flagged(ranks) == {("b", "0"): ("Prometheus's scrape of b:9000 is down (up == 0)",)}


def test_the_command_quotes_a_node_for_the_shell() -> None:
    assert open_command("gpu-8") == "radixtop --node gpu-8"
    assert open_command("me@gpu 8; rm -rf ~") == "radixtop --node 'me@gpu 8; rm -rf ~'"


def series(value: float | None, **labels: str) -> Series:
    return Series(Labels(tuple(labels.items())), value)


def test_answers_fold_into_one_row_per_rank_with_its_node_and_scrape() -> None:
    known = QueryAnswer("known", (
        series(1, job="j", instance="10.0.0.5:9100", rank="0"),
        series(1, job="j", instance="10.0.0.5:9101", rank="1"),
        series(1, job="j", instance="[::1]:9102", rank="0", hostname="gpu-9"),
        series(1, job="j", instance="old:9100", rank="0"),  # seen within the hour, no target now
    ))
    up = QueryAnswer("up", (
        series(1, __name__="up", job="j", instance="10.0.0.5:9100"),
        series(0, __name__="up", job="j", instance="10.0.0.5:9101"),
        series(1, __name__="up", job="j", instance="[::1]:9102", hostname="gpu-9"),
        series(0, __name__="up", job="j", instance="new:9100", node="gpu-10"),  # never answered
    ))
    figures = QueryAnswer("figures", (
        series(1000, __name__="radixtop_capacity_tokens", job="j", instance="10.0.0.5:9100", rank="0"),
        series(2, __name__="radixtop_lock_ref_nodes", job="j", instance="10.0.0.5:9100", rank="0", lock_ref="<0"),
        series(9, __name__="radixtop_lock_ref_nodes", job="j", instance="10.0.0.5:9100", rank="0", lock_ref="1"),
        series(None, __name__="radixtop_protected_tokens", job="j", instance="10.0.0.5:9100", rank="0"),
    ))
    rows = {(r.node, r.rank): r for r in fold(known, up, figures)}
    assert {k: v.scrape for k, v in rows.items()} == {
        ("10.0.0.5", "0"): "up", ("10.0.0.5", "1"): "down", ("gpu-9", "0"): "up", ("gpu-10", "?"): "down",
        ("old", "0"): "gone"}
    assert rows[("10.0.0.5", "0")].capacity == 1000 and rows[("10.0.0.5", "0")].nodes_below_zero == 2
    assert rows[("10.0.0.5", "0")].locked is None
    assert node_of(Labels((("instance", "[::1]:9102"),))) == "::1"
    assert node_of(Labels(())) == "?"


def test_a_failed_poll_keeps_the_last_ranks_marked_down() -> None:
    state = FleetState("http://p:9090")
    ok = FleetSample("http://p:9090", SourceState("ok", "", 100.0), 100.0, (rank("a", 0, negative_lock_ref=1.0),))
    state.apply(ok)
    down = FleetSample("http://p:9090", SourceState("down", "Prometheus at http://p:9090: connection refused", 130.0),
                       130.0)
    state.apply(down)
    view = state.view
    assert view.ranks == ok.ranks and view.ranks_time == 100.0 and len(view.standouts) == 1
    text = render_fleet(view, now=131.0).plain
    assert "DOWN since" in text and "connection refused" in text and "radixtop --node a" in text
    assert state.version == 2
