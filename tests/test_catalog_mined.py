"""The catalog held to what SGLang and vLLM really print: tools/mined/messages.jsonl (mined from
their wheels by tools/mine_strings.py), the lines quoted from compiled code (tools/mined/quoted.toml)
and the messages deliberately left without a signature (tools/mined/not_signatures.toml)."""

from __future__ import annotations

import functools
import json
import re
import tomllib
from pathlib import Path

import pytest

from radixtop.diagnosis.catalog import ROLES, load_catalog

MINED = Path(__file__).resolve().parents[1] / "tools" / "mined"
# The failure kinds every mined message must be accounted for: a signature or a stated reason.
INCIDENT_WORDS = re.compile(
    r"radix|kv[ _-]?pool|token_to_kv|(?<![a-z])lock_ref|(?<![a-z])(?:un)?lock(?:ed)?\b|evict|out of memory"
    r"|\boom\b|retract|sigquit|watchdog|nccl|illegal memory",
    re.IGNORECASE,
)
PLACEHOLDER = re.compile(r"\{\}|%[-#0 +]*\d*(?:\.\d+)?[sdfrixg]")
# What a placeholder is filled with: a number, a word, nothing, and the phase names SGLang passes
# to its "{phase} out of memory" message.
FILLS = ("1", "x", "", "Prefill", "Decode")


def _rows() -> list[dict]:
    with open(MINED / "messages.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _toml(name: str) -> dict:
    with open(MINED / name, "rb") as f:
        return tomllib.load(f)


ROWS = _rows()
CATALOG = load_catalog()
COMPILED = [(sig.id, re.compile(sig.pattern)) for sig in CATALOG.signatures]


def _signatures_matching(message: str) -> set[str]:
    texts = [PLACEHOLDER.sub(fill, message) for fill in FILLS]
    return {sig_id for sig_id, pattern in COMPILED if any(pattern.search(t) for t in texts)}


@functools.cache
def _matched() -> tuple[frozenset[str], ...]:
    """The signatures matching each mined row, in ROWS order."""
    return tuple(frozenset(_signatures_matching(row["message"])) for row in ROWS)


def test_the_table_is_mined_from_every_release() -> None:
    releases = {(row["package"], part) for row in ROWS for part in re.split(r"[,.]{2}|,", row["releases"])}
    versions = {v for _, v in releases}
    for wanted in ("0.3.6.post3", "0.4.0", "0.4.6", "0.4.10", "0.5.1", "0.5.6", "0.5.12", "0.5.23"):
        assert ("sglang", wanted) in releases, wanted
    for wanted in ("0.6.0", "0.8.0", "0.10.0", "0.34.0"):
        assert ("vllm", wanted) in releases, wanted
    assert len(versions) >= 12
    for row in ROWS:
        assert row["message"].strip() and row["files"] and row["how"], row


def test_every_signature_matches_a_real_message() -> None:
    quoted = [line["text"] for line in _toml("quoted.toml")["line"]]
    unmatched = []
    for sig_id, pattern in COMPILED:
        mined = any(sig_id in found for found in _matched())
        if not mined and not any(pattern.search(text) for text in quoted):
            unmatched.append(sig_id)
    assert unmatched == [], "signatures matching no mined message and no quoted line"


def test_every_quoted_line_has_a_source_and_a_signature() -> None:
    for line in _toml("quoted.toml")["line"]:
        assert line["source"].strip()
        assert any(p.search(line["text"]) for _, p in COMPILED), line["text"]


def _unsigned_incident_messages() -> list[dict]:
    return [r for r, found in zip(ROWS, _matched()) if INCIDENT_WORDS.search(r["message"]) and not found]


def test_every_incident_message_has_a_signature_or_a_reason() -> None:
    entries = _toml("not_signatures.toml")["entry"]
    rules = [(re.compile(e["match"]), set(e.get("how", ())), e) for e in entries]
    used = [0] * len(rules)
    missing = []
    for row in _unsigned_incident_messages():
        hits = [
            i
            for i, (pattern, how, _) in enumerate(rules)
            if (not how or how & set(row["how"])) and pattern.search(row["message"])
        ]
        if not hits:
            missing.append(f"{row['package']} {row['releases']}: {row['message'][:120]}")
        for i in hits:
            used[i] += 1
    assert missing == [], "mined incident messages with neither a signature nor a reason"
    for (_, _, entry), count in zip(rules, used):
        assert entry["reason"].strip()
        assert count > 0, f"stale entry (covers no unsigned message): {entry['match']}"


@pytest.mark.parametrize(
    ("message", "sig_id"),
    [
        # The same failure as older and newer releases word it.
        ("Decode out of memory happened. #retracted_reqs: {}, #new_token_ratio: {} -> {}", "kv-pool-retract"),
        ("KV cache pool is full. Retract requests. #retracted_reqs: {}, #new_token_ratio: {} -> {}", "kv-pool-retract"),
        ("Received sigquit from a child process. It usually means the child failed.", "child-sigquit"),
        ("SIGQUIT received. signum={}, frame={}. It usually means one child failed.", "child-sigquit"),
        ("Watchdog timeout (self.watchdog_timeout={})", "watchdog-timeout"),
        ("{} watchdog timeout (self.watchdog_timeout={}, self.soft={})", "watchdog-timeout"),
        # The radix cache's own failures.
        ("SWA Radix tree sanity check failed, ping @hanming-lu: {}", "radix-tree-sanity-check-failed"),
        ("Mamba Radix tree sanity check failed, ping @yizhang2077: {}", "radix-tree-sanity-check-failed"),
        ("node is in use, x.id={}", "radix-evict-locked-node"),
        ("node is in use by swa kv indices, x.id={}", "radix-evict-locked-node"),
        ("dec_lock_ref on node with node.swa_lock_ref={}, node.id={}", "lock-ref-release-underflow"),
        ("SWA window release hit lock_ref=0 on node {}", "lock-ref-release-underflow"),
        ("Mamba release hit lock_ref=0 on node {}", "lock-ref-release-underflow"),
        (
            "tombstone swa_lock_ref should always be 0, node.full_lock_ref={}, node.swa_lock_ref={}, node.id={}",
            "radix-lock-invariant",
        ),
        ("Subprocess {} (pid={}) crashed with exit code {}. Triggering SIGQUIT for cleanup...", "subprocess-crashed"),
        ("NCCL error: {}", "nccl-error"),
    ],
)
def test_mined_wordings_reach_their_signature(message: str, sig_id: str) -> None:
    assert any(row["message"] == message for row in ROWS), "no longer in the mined table"
    assert sig_id in _signatures_matching(message)


def test_every_signature_has_a_role() -> None:
    text = (Path(__file__).resolve().parents[1] / "radixtop" / "diagnosis" / "signatures.toml").read_text("utf-8")
    assert text.count("\nrole = ") == len(CATALOG.signatures)  # written out, not defaulted
    roles = {sig.id: sig.role for sig in CATALOG.signatures}
    assert set(roles.values()) == set(ROLES)
    for consequence in (
        "child-sigquit", "scheduler-exception", "nccl-watchdog-timeout", "nccl-aborted", "subprocess-crashed"
    ):
        assert roles[consequence] == "consequence", consequence
    for notice in ("kv-pool-retract", "server-ready", "fp8-kv-no-scales", "flashinfer-jit-fallback"):
        assert roles[notice] == "notice", notice
    for cause in ("radix-page-lock-eviction", "cuda-illegal-memory-access", "radix-evict-locked-node"):
        assert roles[cause] == "cause", cause


def test_radix_cache_causes_say_how_they_differ_from_the_seed_race() -> None:
    for sig in CATALOG.signatures:
        if sig.subsystem == "radix-cache" and sig.role == "cause" and sig.id != "radix-page-lock-eviction":
            assert any("lock/evict race" in c for c in sig.competing), sig.id
            assert sig.first_checks and sig.meaning
