"""The keys are written once (radixtop/tui/keys.py): the bindings, the help screen and the README
come from that table or are held to it, and a user keymap moves a key everywhere it is shown."""

from __future__ import annotations

import re
from pathlib import Path

from textual.keys import format_key

from radixtop.tui.app import RadixtopApp
from radixtop.tui.help import HelpScreen
from radixtop.tui.keys import KEYS, help_rows, load_keymap

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_keys() -> str:
    text = README.read_text(encoding="utf-8")
    return text[text.index("## Keys") : text.index("\n## ", text.index("## Keys") + 3)]


def test_every_key_is_in_the_readme_as_a_person_types_it():
    section = readme_keys()
    for key in KEYS:
        for name in key.keys.split(","):
            typed = format_key(name)
            assert re.search(rf"`{re.escape(typed)}`", section, re.IGNORECASE), f"{key.id}: `{typed}` not in README"


def test_the_app_binds_exactly_the_table_and_the_help_lists_it():
    bound = {b.id: b for b in RadixtopApp.BINDINGS}
    assert set(bound) == {k.id for k in KEYS}
    for key in KEYS:
        assert (bound[key.id].key, bound[key.id].action) == (key.keys, key.action)
    rows = {key_id: (keys, what) for keys, what, key_id in help_rows()}
    assert rows["quit"][0] == "q" and rows["quit"][1].startswith("quit")
    assert rows["filter"][0] == "& or \\" and rows["filter"][1].startswith("filter")


async def test_a_keymap_file_moves_a_key_in_the_app_and_its_help(tmp_path: Path, monkeypatch):
    keymap = tmp_path / "keymap.toml"
    keymap.write_text('[keys]\nquit = "ctrl+q"\nhelp = "h"\n', encoding="utf-8")
    monkeypatch.setenv("RADIXTOP_KEYMAP", str(keymap))
    app = RadixtopApp()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("q")
        await pilot.pause(0.1)
        assert app.is_running  # q no longer quits
        await pilot.press("h")
        await pilot.pause(0.1)
        assert isinstance(app.screen, HelpScreen) and app.screen.keymap == {"quit": "ctrl+q", "help": "h"}
        listed = {key_id: keys for keys, _, key_id in help_rows(app.screen.keymap)}
        assert listed["quit"] == "ctrl+q" and listed["help"] == "h"  # what the help lists
        await pilot.press("escape")
        await pilot.press("ctrl+q")
        await pilot.pause(0.2)
        assert not app.is_running


async def test_a_keymap_that_cannot_be_used_is_one_notice_and_the_default_keys(tmp_path: Path, monkeypatch):
    keymap = tmp_path / "keymap.toml"
    keymap.write_text('[keys]\nquitt = "ctrl+q"\n', encoding="utf-8")
    assert "unknown key ids quitt" in (load_keymap(keymap)[1] or "")
    monkeypatch.setenv("RADIXTOP_KEYMAP", str(keymap))
    app = RadixtopApp()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.1)
        assert any(n.kind == "keymap" and "quitt" in n.message for n in app.state.notices)
        await pilot.press("q")
        await pilot.pause(0.2)
        assert not app.is_running
    keymap.write_text("not toml [", encoding="utf-8")
    assert "not read" in (load_keymap(keymap)[1] or "")


async def test_a_keymap_whose_quit_could_never_run_is_refused_in_one_notice(tmp_path: Path, monkeypatch):
    # ctrl+c is the screen's (copy) before any app binding sees it, and help on ctrl+q shadows
    # Textual's own quit: with this file, before, no key quit radixtop.
    keymap = tmp_path / "keymap.toml"
    keymap.write_text('[keys]\nquit = "ctrl+c"\nhelp = "ctrl+q"\n', encoding="utf-8")
    monkeypatch.setenv("RADIXTOP_KEYMAP", str(keymap))
    app = RadixtopApp()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.1)
        notices = [n.message for n in app.state.notices if n.kind == "keymap"]
        assert len(notices) == 1 and 'quit = "ctrl+c" never runs: the screen takes ctrl+c first' in notices[0]
        assert "\n" not in notices[0] and notices[0].endswith("the default keys are in use")
        await pilot.press("q")  # the default keys stay
        await pilot.pause(0.2)
        assert not app.is_running


def test_a_keymap_giving_one_key_to_several_bindings_is_refused(tmp_path: Path):
    keymap = tmp_path / "keymap.toml"
    keymap.write_text('[keys]\n' + "".join(f'{k.id} = "q"\n' for k in KEYS), encoding="utf-8")
    keys, problem = load_keymap(keymap)
    assert keys == {} and problem is not None and "\n" not in problem
    assert "q is bound to quit, help, follow" in problem and "give each its own key" in problem
    keymap.write_text('[keys]\nhelp = "q"\n', encoding="utf-8")  # q still quits by default
    assert "q is bound to quit, help" in (load_keymap(keymap)[1] or "")
    keymap.write_text('[keys]\nquit = "x"\nhelp = "q"\n', encoding="utf-8")  # moved out of each other's way
    assert load_keymap(keymap) == ({"quit": "x", "help": "q"}, None)


async def test_a_keymap_file_moves_a_dialogs_keys_too(tmp_path: Path, monkeypatch):
    """The plan's approve and refuse keys are no different: the keymap moves them by their ids."""
    from radixtop.widgets.confirm import PlanScreen
    from radixtop.widgets.keys import WIDGET_KEYS

    keymap = tmp_path / "keymap.toml"
    keymap.write_text('[keys]\napprove = "a"\nrefuse = "r"\n', encoding="utf-8")
    assert load_keymap(keymap) == ({"approve": "a", "refuse": "r"}, None)
    monkeypatch.setenv("RADIXTOP_KEYMAP", str(keymap))
    app = RadixtopApp()
    answers: list[bool | None] = []
    async with app.run_test(size=(100, 30)) as pilot:
        app.push_screen(PlanScreen(["a plan"]), answers.append)
        await pilot.pause(0.1)
        await pilot.press("y")  # no longer approves
        await pilot.pause(0.1)
        assert answers == [] and isinstance(app.screen, PlanScreen)
        await pilot.press("a")
        await pilot.pause(0.1)
        assert answers == [True]
    ids = {key_id for _, _, key_id in help_rows()}
    assert {k.id for k in WIDGET_KEYS} <= ids  # the help lists every id a keymap may use


def test_every_binding_in_the_app_has_an_id_a_keymap_can_move() -> None:
    """No key is bound without an id: the README's promise that any key moves."""
    import importlib
    import inspect
    import pkgutil

    import radixtop.tui
    import radixtop.widgets
    from radixtop.widgets.keys import WIDGET_KEYS

    ids = {k.id for k in (*KEYS, *WIDGET_KEYS)}
    seen = 0
    for package in (radixtop.widgets, radixtop.tui):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            own = [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
            for cls in own:
                for b in cls.__dict__.get("BINDINGS", ()):
                    seen += 1
                    assert getattr(b, "id", None) in ids, f"{cls.__name__}: {b!r} has no keymap id"
    assert seen >= len(WIDGET_KEYS)
