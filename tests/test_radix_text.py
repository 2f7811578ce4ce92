"""The radix pane's prefixes as text: the served model's tokenizer.json read from this node's disk
(radixtop/probes/tokenizer.py), the rows decoded, escaped and cut (widgets/radix.py), the key that
flips text and ids, the one line that says why a tree shows ids or its shape alone, and the live
sources' wiring (session/live.py); last, the same against a real SGLang server and its model's
own tokenizer.json.

Update the screenshot after an intended change with
`pytest tests/test_radix_text.py --snapshot-update` and look at the SVG before committing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from radix_text_helpers import SYSTEM, encode, make_tokenizer, text_snapshot
from sglang_gate import why_no_server
from textual.app import App, ComposeResult

from radixtop.probes.radix import RadixSample
from radixtop.probes.radix_tree import TreeIndex
from radixtop.probes.sglang import ServerInfo, ServerSample
from radixtop.probes.status import SourceState
from radixtop.probes.tokenizer import find_tokenizer, load_for_server, load_tokenizer
from radixtop.session.live import LiveSources, LiveState, Targets
from radixtop.session.radix_board import RadixBoard
from radixtop.textsafe import printable_escaped
from radixtop.widgets.keys import TREE_TEXT
from radixtop.widgets.radix import RadixPane, RadixTreeView

T0 = 1_700_000_000.0
URL = "http://127.0.0.1:39100"
pytestmark = pytest.mark.usefixtures("utc")


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("model") / "tiny")


# ----------------------------------------------------------------------------------------------
# Reading and decoding


def test_a_heads_ids_decode_to_their_text_and_ids_of_another_model_stay_ids(tokenizer_json: Path) -> None:
    tokens, why = load_tokenizer(tokenizer_json)
    assert tokens is not None and why == ""
    ids = encode(tokenizer_json, SYSTEM)
    assert tokens.decode(ids) == SYSTEM
    assert tokens.decode(ids[:3]) == "You are a"  # a node's head: its first tokens
    assert tokens.decode([*ids[:2], tokens.vocab]) is None, "an id past the vocabulary: not this model's"
    assert tokens.decode([12567198, 6918629]) is None  # the simulator's 24-bit ids
    assert tokens.decode([-1]) is None and tokens.decode([]) is None
    assert tokens.decode([1]) == "</s>", "special tokens are part of what was cached"


def test_tokenizer_json_is_read_only_as_a_regular_file_under_the_cap(tokenizer_json: Path, tmp_path: Path) -> None:
    assert load_tokenizer(tmp_path / "tokenizer.json") == (None, f"no tokenizer.json in {tmp_path}")
    fifo = tmp_path / "fifo" / "tokenizer.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    began = time.monotonic()
    assert load_tokenizer(fifo)[1].endswith("is not a regular file")
    assert time.monotonic() - began < 2, "a FIFO is refused, never waited on"
    size = tokenizer_json.stat().st_size
    tokens, why = load_tokenizer(tokenizer_json, max_bytes=size - 1)
    assert tokens is None and "over radixtop's" in why
    junk = tmp_path / "junk" / "tokenizer.json"
    junk.parent.mkdir()
    junk.write_bytes(b"\xff\xfe not json")
    assert "is no tokenizer the tokenizers library reads" in load_tokenizer(junk)[1]
    link = tmp_path / "link" / "tokenizer.json"  # the hub's cache: links to blobs
    link.parent.mkdir()
    link.symlink_to(tokenizer_json)
    assert load_tokenizer(link)[0] is not None


def test_the_folder_is_tokenizer_path_then_model_path_then_the_hub_cache(
    tokenizer_json: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tokenizer_json.parent
    assert find_tokenizer({"model_path": "/nowhere", "tokenizer_path": str(folder)}) == (tokenizer_json, "")
    assert find_tokenizer({"model_path": str(folder)}) == (tokenizer_json, "")
    assert find_tokenizer({}) == (None, "/server_info names no model_path")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    missing = find_tokenizer({"model_path": "org/model\x1b[2J"})
    assert missing[0] is None and "\x1b" not in missing[1] and "is no folder on this node" in missing[1]
    snap = tmp_path / "hub" / "models--org--model" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "tokenizer.json").symlink_to(tokenizer_json)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc123")
    assert find_tokenizer({"model_path": "org/model"}) == (snap / "tokenizer.json", "")
    assert find_tokenizer({"model_path": "../model"})[0] is None


def test_a_server_elsewhere_is_not_matched_against_this_nodes_files(tokenizer_json: Path) -> None:
    info = {"model_path": str(tokenizer_json.parent)}
    assert load_for_server(info, local=True)[0] is not None
    assert load_for_server(info, local=False) == (None, "the server is not on this node, so its tokenizer.json "
                                                        "is not either")


def test_decoded_text_is_one_line_that_shows_its_breaks_and_no_control() -> None:
    assert printable_escaped("a\nb\r\n") == "a\\nb\\r\\n"
    assert printable_escaped("red\x1b[31m\u202eevil\x07") == "red\ufffd[31m\ufffdevil\ufffd"
    assert printable_escaped("tab\there") == "tab here"
    assert printable_escaped("plain") == "plain"


# ----------------------------------------------------------------------------------------------
# The rows


class PaneApp(App):
    def compose(self) -> ComposeResult:
        yield RadixPane(id="pane")


def _board(snap) -> RadixBoard:
    board = RadixBoard()
    board.add(RadixSample(URL, SourceState("ok", "", T0), T0, rank=0, snapshot=snap, index=TreeIndex.build(snap)))
    return board


def _rows(view: RadixTreeView, n: int = 6) -> list[str]:
    return [view.render_line(y).text.rstrip() for y in range(n)]


async def test_rows_show_the_prefix_as_text_escaped_and_cut_and_the_key_flips_to_ids(tokenizer_json: Path) -> None:
    tokens, _ = load_tokenizer(tokenizer_json)
    app = PaneApp()
    async with app.run_test(size=(80, 24)) as pilot:
        pane = app.query_one(RadixPane)
        view = pane.tree_view
        view.set_text_source(tokens, "")
        pane.show(_board(text_snapshot(tokenizer_json)), now=T0)
        view.focus()
        await pilot.press("down", "enter")
        await pilot.pause()
        rows = _rows(view)
        assert "root · 3 nodes" in rows[0]
        # The system prompt: its newline as \n, cut to the 80 columns with "…" inside the quotes.
        assert rows[1].endswith('▾ #1 "You are a helpful assistant.\\nAnswer in…"'), rows
        assert len(rows[1]) <= 78
        assert rows[2].endswith('#2 "What is a radix tree?"'), rows  # the whole node: no "…"
        assert rows[3].endswith('#3 "Hello\ufffd[31m world"'), "the escape sequence never reaches the terminal"
        assert not view.note(), "text shown: nothing to say"
        await pilot.press(TREE_TEXT.keys)
        await pilot.pause()
        ids = encode(tokenizer_json, SYSTEM)
        assert rows[0] == _rows(view)[0]
        assert _rows(view)[1].endswith(f"▾ #1 [{' '.join(map(str, ids[:4]))} …]"), _rows(view)
        await pilot.press(TREE_TEXT.keys)
        await pilot.pause()
        assert _rows(view)[1].endswith('"You are a helpful assistant.\\nAnswer in…"')


async def test_why_the_rows_are_ids_or_shape_is_said_once_above_them(tokenizer_json: Path) -> None:
    app = PaneApp()
    async with app.run_test(size=(80, 24)) as pilot:
        pane = app.query_one(RadixPane)
        view = pane.tree_view
        view.set_text_source(None, "no tokenizer.json in /models/m")
        pane.show(_board(text_snapshot(tokenizer_json)), now=T0)
        await pilot.pause()
        rows = _rows(view)
        assert rows[0] == "token ids only: no tokenizer.json in /models/m"
        assert "root · 3 nodes" in rows[1] and "#1 [" in rows[2]
        assert sum("tokenizer.json" in r for r in _rows(view, 20)) == 1, "once, not per row"
        deep = "/srv/models/" + "/".join(["nested"] * 12) + "/Llama-3.1-8B-Instruct"
        view.set_text_source(None, f"no tokenizer.json in {deep}")
        await pilot.pause()
        line = _rows(view)[0]  # cut in its middle: what is missing, and which model's folder
        assert line.startswith("token ids only: no tokenizer.json in /") and line.endswith("/Llama-3.1-8B-Instruct")
        assert "…" in line and len(line) <= 78, line
        view.focus()
        await pilot.press("down")
        assert view.cursor == 1  # the line above is no row: the cursor is on #1
        await pilot.press(TREE_TEXT.keys)  # ids asked for: nothing to explain
        await pilot.pause()
        assert "root · 3 nodes" in _rows(view)[0]
        # The Rust core's walk: no token ids at all, whatever the tokenizer.
        snap = text_snapshot(tokenizer_json, lock_detail="locked-only")
        bare = tuple(n._replace(head=()) for n in snap.tree.nodes)
        shape = replace(snap, tree=replace(snap.tree, nodes=bare))
        pane.show(_board(shape), now=T0)
        await pilot.pause()
        rows = _rows(view)
        assert rows[0] == "shape only: the Rust core's walk carries no token ids"
        assert rows[2].rstrip().endswith("#1") and "[" not in rows[2], rows
        kv = replace(shape, lock_detail="none")
        pane.show(_board(kv), now=T0)
        await pilot.pause()
        assert _rows(view)[0] == "shape only: these kv-events carry no token ids"


def test_radix_text_80x24_no_color(snap_compare, tokenizer_json: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    tokens, _ = load_tokenizer(tokenizer_json)

    async def run(pilot) -> None:
        pane = pilot.app.query_one(RadixPane)
        pane.tree_view.set_text_source(tokens, "")
        pane.show(_board(text_snapshot(tokenizer_json)), now=T0)
        pane.tree_view.focus()
        await pilot.press("down", "enter")
        await pilot.pause()

    assert snap_compare(PaneApp(), terminal_size=(80, 24), run_before=run)


# ----------------------------------------------------------------------------------------------
# The live sources


async def test_the_live_sources_read_the_served_models_tokenizer_off_the_loop(tokenizer_json: Path) -> None:
    state = LiveState()
    sources = LiveSources(Targets(url=URL), state, gpu=False)
    raw = {"model_path": str(tokenizer_json.parent), "tokenizer_path": str(tokenizer_json.parent)}
    info = ServerInfo(URL, "sglang", raw=raw)
    await sources._follow_server(ServerSample(URL, SourceState("ok", "", T0), T0, info=info))
    assert state.tokens is None and state.tokens_note == "reading the model's tokenizer.json…"
    await sources._tasks["tokenizer"]
    assert state.tokens is not None and state.tokens.decode(encode(tokenizer_json, "Hello")) == "Hello"
    version = state.version
    await sources._follow_server(ServerSample(URL, SourceState("ok", "", T0), T0 + 2, info=info))
    assert state.version == version, "read once per model, not per poll"
    elsewhere = LiveSources(Targets(url="http://10.0.0.7:30000"), LiveState(), gpu=False)
    await elsewhere._follow_server(ServerSample(URL, SourceState("ok", "", T0), T0,
                                                info=ServerInfo("http://10.0.0.7:30000", "sglang", raw=raw)))
    await elsewhere._tasks["tokenizer"]
    assert elsewhere.state.tokens is None and "not on this node" in elsewhere.state.tokens_note
    await sources.aclose()
    await elsewhere.aclose()
    assert "no server URL" in LiveSources(Targets(), LiveState(), gpu=False).state.tokens_note


# ----------------------------------------------------------------------------------------------
# A real SGLang server

NO_SERVER = why_no_server()
needs_server = pytest.mark.skipif(NO_SERVER is not None, reason=NO_SERVER or "")


@needs_server
@pytest.mark.slow
def test_a_real_servers_prefix_reads_as_its_text_in_the_radix_pane(tmp_path: Path) -> None:
    """SGLang 0.5.23 (Python core, radixtop's instrument on) serving the tiny model, whose folder
    has a real tokenizer.json: a prompt's ids (tokenized with that same file) go in; radixtop's own
    path (ServerProbe's /server_info -> the tokenizer; RadixProbe -> the board -> the pane) shows
    the prompt's text on the node's row."""
    from real_sglang import start_server

    server = start_server(tmp_path, core="python", name="text")
    try:
        tok_file = server.model / "tokenizer.json"
        prompt = "you are a radix tree watcher\nsay what the cache holds " * 4
        ids = encode(tok_file, prompt)
        assert len(ids) >= 32, len(ids)
        for tail in range(2):  # a shared prefix, two tails: the prefix is a node of its own
            server.generate([*ids, 50 + tail, 60 + tail, 70 + tail], max_new_tokens=4)
        state = asyncio.run(_watch(server.url))
    finally:
        server.stop()
    assert state.tokens is not None, state.tokens_note
    view = next(v for v in state.board.ordered() if v.snapshot is not None and v.snapshot.tree is not None)
    heads = [n.head for n in view.snapshot.tree.nodes if n.head]
    assert any(tuple(ids[: len(h)]) == h for h in heads), heads

    async def render() -> list[str]:
        app = PaneApp()
        async with app.run_test(size=(80, 24)) as pilot:
            pane = app.query_one(RadixPane)
            pane.tree_view.set_text_source(state.tokens, state.tokens_note)
            pane.show(state.board)
            pane.tree_view.focus()
            await pilot.press("x", "end", "home")
            await pilot.pause()
            return [pane.tree_view.render_line(y).text for y in range(10)]

    rows = asyncio.run(render())
    assert any('"you are a radix tree watcher\\nsay' in r for r in rows), "\n".join(rows)


async def _watch(url: str) -> LiveState:
    """radixtop's live sources on the server until they hold its tokenizer and a tree with ids."""
    state = LiveState()
    sources = LiveSources(Targets(url=url), state, gpu=False, interval_s=0.5)
    task = asyncio.create_task(sources.run())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            views = [v for v in state.board.ordered() if v.snapshot is not None and v.snapshot.tree is not None]
            if state.tokens is not None and any(len(v.snapshot.tree.nodes) > 2 for v in views):
                break
            await asyncio.sleep(0.25)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return state


async def test_a_note_above_the_rows_draws_in_no_color(tokenizer_json: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NO_COLOR's monochrome filter needs a style on every segment: the note above the rows (here
    the Rust core's "shape only") is padded to the pane's width in the pane's style, not in none
    (Textual's filter raised on it and the app ended)."""
    monkeypatch.setenv("NO_COLOR", "1")
    snap = text_snapshot(tokenizer_json, lock_detail="locked-only")
    shape = replace(snap, tree=replace(snap.tree, nodes=tuple(n._replace(head=()) for n in snap.tree.nodes)))
    app = PaneApp()
    async with app.run_test(size=(100, 24)) as pilot:
        pane = app.query_one(RadixPane)
        pane.show(_board(shape), now=T0)
        await pilot.pause()
        view = pane.tree_view
        assert _rows(view)[0] == "shape only: the Rust core's walk carries no token ids"
        note = view.render_line(0)
        assert note.cell_length == view.size.width
        assert all(segment.style is not None for segment in note), list(note)
    assert app.return_code in (None, 0), "the app ended on an error"
