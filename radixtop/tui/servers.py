"""The server watched: picking one among several, switching to another (s), a log that is no file.

RadixtopApp inherits ServerChoice. Discovery (probes/discovery.py) finds the servers; the panes
(tui/panes.py) ask `pick_server` when discovery finds more than one, and `s` lists them again to watch
another. A server whose output goes to a tmux pane is read from the pane, and `tmux pipe-pane` is
offered for every line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from textual import work

from radixtop.tui.guard import guarded

if TYPE_CHECKING:
    from textual.app import App

    from radixtop.session.incident_state import IncidentState
    from radixtop.tui.panes import LiveOptions, Panes

    _AppBase = App[int]
else:
    _AppBase = object


class ServerChoice(_AppBase):
    """Mixin for RadixtopApp: which server the live panes watch, and how its log is read."""

    _picked: tuple[int, str | None] | None = None  # (pid, url) the user picked, for the session

    if TYPE_CHECKING:  # the app's
        state: IncidentState
        panes: Panes | None

        def _add_lines(self, lines: list[str]) -> None: ...

        def _new_panes(self, options: LiveOptions) -> Panes: ...

        def _leave_logs(self) -> None: ...

        def _run_live(self) -> Any: ...

    def _log_source(self) -> Any:
        targets = self.panes.targets if self.panes is not None else None
        return targets.log_source if targets is not None else None

    def _stop_log_source(self) -> None:
        """Undo what following a non-file log changed (a tmux pipe) and stop its reader."""
        source = self._log_source()
        if source is not None:
            try:
                source.stop()
            except Exception as exc:  # quitting must not fail because of it
                self.log.error(f"stopping {source.name} failed: {exc!r}")

    def _offer_pipe(self) -> None:
        """A tmux pane is read every second; offer `tmux pipe-pane` (every line, but it changes
        the user's tmux until radixtop exits)."""
        from radixtop.widgets.picker import Question

        source = self._log_source()
        if source is None:
            return
        source.set_notes(self._note_from_thread)
        if source.pane is None:
            return
        name = source.pane.pane.name
        if source.pane.pane.piped:  # tmux keeps one pipe a pane: the user's stays
            self._add_lines([f"{name} already pipes its output elsewhere (tmux pipe-pane): it is read every second"])
            return
        lines = [
            f"The server's output goes to {name}; radixtop shows what the pane holds and reads it every second",
            "(a flood of more than a thousand lines a second can slip between two reads).",
            f"tmux pipe-pane would copy every line the pane prints to {source.path};",
            "it changes that pane's settings while radixtop runs and is undone when radixtop exits.",
        ]

        def answered(yes: bool | None) -> None:
            if yes:
                self._pipe_pane(source)
            else:
                self._add_lines([f"reading {name} every second (no tmux pipe-pane)"])

        self.push_screen(Question(lines, f"Follow {name} through tmux pipe-pane?"), answered)

    def _note_from_thread(self, text: str) -> None:
        try:
            self.call_from_thread(self._add_lines, [text])
        except RuntimeError:
            pass  # the app has gone: nothing to show it in

    @work(group="pipe-pane", exit_on_error=False)
    async def _pipe_pane(self, source: Any) -> None:
        why = await asyncio.to_thread(source.pane.pipe)
        self._add_lines(
            [why or f"following {source.pane.pane.name} through tmux pipe-pane (undone when radixtop exits)"]
        )

    async def pick_server(self, servers: Sequence[Any], current: int | None = None) -> Any:
        """The server to watch among several: the one picked earlier in this session while it
        runs, else the user's choice in the picker (None: Esc)."""
        from radixtop.widgets.picker import ServerPicker

        if self._picked is not None and current is None:
            pid, url = self._picked
            for s in servers:
                if s.pid == pid or (url is not None and s.url == url):
                    return s
        loop = asyncio.get_running_loop()
        chosen: asyncio.Future[int | None] = loop.create_future()
        rows = [server_row(s, s.pid == current) for s in servers]

        def answer(index: int | None) -> None:
            if not chosen.done():
                chosen.set_result(index)

        self.push_screen(ServerPicker(rows), answer)
        index = await chosen
        if index is None:
            return None
        picked = servers[index]
        self._picked = (picked.pid, picked.url)
        return picked

    @guarded("servers")
    def action_server(self) -> None:
        self._switch_server()

    @work(exclusive=True, group="servers", exit_on_error=False)
    async def _switch_server(self) -> None:
        from radixtop.probes.discovery import discover
        from radixtop.session.live import ranked

        panes = self.panes
        if panes is None:
            return
        found = await discover()
        if not found.servers:
            self._add_lines(found.describe())
            return
        current = panes.targets.pid if panes.targets is not None else None
        chosen = await self.pick_server(ranked(found.servers), current=current if current is not None else -1)
        if chosen is None or chosen.pid == current:
            return
        self.workers.cancel_group(self, "live")
        self._stop_log_source()
        options = panes.options  # the panes exist only with live options
        if not options.logs:  # a log given with --log stays followed
            self._leave_logs()
        self._add_lines([f"switching to {chosen.name} pid {chosen.pid}" + (f" at {chosen.url}" if chosen.url else "")
                         + "; the lines above stay"])
        self.panes = self._new_panes(options)
        self.panes.mounted = panes.mounted
        self.panes.layout(self.size.width, self.size.height)
        self._run_live()


def server_row(server: Any, current: bool = False) -> Any:
    """A found server as the picker lists it."""
    from radixtop.widgets.picker import ServerRow, uptime_text

    if server.log_path:
        log = server.log_path
    elif server.log_elsewhere is not None:
        log = server.log_elsewhere.name
    else:
        log = "no log found"
    return ServerRow(port=str(server.port) if server.port else "—", kind=server.name, model=server.model,
                     pid=server.pid, uptime=uptime_text(time.time() - server.started), log=log,
                     current=current)
