"""The fleet view inside the app (`radixtop --prometheus URL`): the fleet's Prometheus polled in a
worker of its own, the samples folded into session/fleet.py's FleetState, the view
(widgets/fleet.py) redrawn after each poll while it is open. It opens at start-up;
F shows it again.

RadixtopApp inherits FleetWatch: init_fleet() in __init__, start_fleet() once mounted.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from textual import work

from radixtop.tui.guard import guarded

if TYPE_CHECKING:
    from textual.app import App

    from radixtop.session.fleet import FleetState
    from radixtop.widgets.fleet import FleetScreen

    _AppBase = App[int]
else:
    _AppBase = object

NO_PROMETHEUS = "no fleet to show: start radixtop with --prometheus URL (the fleet's Prometheus, e.g. http://host:9090)"


def checked_url(url: str | None) -> str | None:
    """--prometheus as given, checked before the app starts: a bad URL is one line, not a view."""
    if url is None:
        return None
    from radixtop.errors import UsageError
    from radixtop.probes.prometheus import check_url

    try:
        return check_url(url)
    except ValueError as exc:
        raise UsageError(f"--prometheus: {exc}") from None


class FleetWatch(_AppBase):
    """Mixin for RadixtopApp: the fleet view and the worker that feeds it."""

    fleet_url: str | None = None
    fleet_state: FleetState | None = None
    fleet_screen: FleetScreen | None = None
    fleet_interval_s: float | None = None  # overrides the probe's own (tests)

    def init_fleet(self, url: str | None, *, interval_s: float | None = None) -> None:
        self.fleet_url = url
        self.fleet_interval_s = interval_s

    def start_fleet(self) -> None:
        """Once mounted: poll the fleet and show its view, when --prometheus named one."""
        if self.fleet_url is None:
            return
        from radixtop.probes.prometheus import shown_url
        from radixtop.session.fleet import FleetState

        self.fleet_state = FleetState(shown_url(self.fleet_url))  # shown: a password in the URL masked
        self._poll_fleet()
        self.action_fleet()

    @guarded("fleet view")
    def action_fleet(self) -> None:
        if self.fleet_state is None:
            self.notify(NO_PROMETHEUS, severity="warning")
            return
        if self.fleet_screen is not None:
            return
        from radixtop.widgets.fleet import FleetScreen

        screen = self.fleet_screen = FleetScreen(self.fleet_state.view)

        def closed(_: Any = None) -> None:
            self.fleet_screen = None

        self.push_screen(screen, closed)

    @work(exclusive=True, group="fleet", exit_on_error=False)
    async def _poll_fleet(self) -> None:
        from radixtop.probes.fleet_probe import FleetProbe
        from radixtop.probes.status import poll_forever

        state = self.fleet_state
        if state is None or self.fleet_url is None:
            return
        probe = FleetProbe(self.fleet_url)
        try:
            async for sample in poll_forever(probe, interval_s=self.fleet_interval_s):
                state.apply(sample)
                self._show_fleet()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.notify(f"reading the fleet's Prometheus failed: {exc!r}; the fleet view stops updating",
                        severity="error")
        finally:
            await probe.aclose()

    @guarded("fleet view")
    def _show_fleet(self) -> None:
        screen, state = self.fleet_screen, self.fleet_state
        if screen is not None and state is not None and screen.is_attached:
            screen.show(state.view)
