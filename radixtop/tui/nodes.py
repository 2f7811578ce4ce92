"""Other nodes inside the app (`radixtop --node HOST`): reached before the app starts
(session/node_watch.py), their spools followed as logs, their forwarded endpoints as radix panes
named by node; each link's state changes said in the log pane, and every link stopped at exit.

RadixtopApp inherits NodeWatching: init_nodes() in __init__, poll_nodes() with the sources'
health, stop_nodes() at unmount. prepare_nodes() runs in run_tui, before the app exists.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixtop.options import TuiOptions
    from radixtop.probes.logbatch import HealthState
    from radixtop.session.incident_state import IncidentState
    from radixtop.session.node_watch import NodeWatch


def prepare_nodes(options: TuiOptions) -> tuple[TuiOptions, NodeWatch | None]:
    """The options with this node's logs named (discovery would find them after the app starts,
    but the log pane follows the nodes' spools from its start, and one follower follows all), and
    the nodes linked; (options, None) without --node."""
    if not options.nodes:
        return options, None
    import asyncio

    from radixtop.incident.commands import node_targets
    from radixtop.probes.node_local import local_report
    from radixtop.session.node_watch import connect_nodes

    targets = node_targets(options.nodes, options.node_urls, (), options.ssh_config, options.remote_radixtop)
    logs = options.logs
    if not logs and options.discover:
        report = asyncio.run(local_report())
        logs = tuple(dict.fromkeys(s.log_path for s in report.servers if s.log_path))
    watch = connect_nodes([t.host for t in targets], urls={t.host: t.url for t in targets if t.url},
                          ssh_config=options.ssh_config, command=options.remote_radixtop,
                          say=lambda line: print(line, file=sys.stderr))
    return replace(options, logs=logs), watch


_HEALTH: dict[str, HealthState] = {
    "streaming": "ok", "connecting": "waiting", "retrying": "error", "stopped": "waiting",
}


class NodeWatching:
    """The app's side of the linked nodes."""

    state: IncidentState
    nodes: NodeWatch | None
    _node_states: dict[str, tuple[str, str]]
    _node_streamed: set[str]  # the nodes whose stream has run: streaming again is "back"

    def init_nodes(self, nodes: NodeWatch | None) -> None:
        self.nodes = nodes
        self._node_states = {}
        self._node_streamed = set()

    def say_node_failures(self) -> None:
        if self.nodes is not None:
            for _, line in self.nodes.failures:
                self.state.add_notice("radixtop", "error", line)

    def poll_nodes(self) -> None:
        """Each node's state on the status line (`ssh HOST`), and said in the log pane when it changes."""
        if self.nodes is None:
            return
        from radixtop.probes.logbatch import SourceHealth

        links = self.nodes.health()
        self.state.set_health(
            [SourceHealth(f"ssh {host}", "error", line, 0, None) for host, line in self.nodes.failures]
            + [SourceHealth(f"ssh {h.node}", _HEALTH.get(h.state, "error"), h.detail, h.lines, None) for h in links]
        )
        for health in links:
            said = (health.state, health.detail)
            if self._node_states.get(health.node) == said:
                continue
            self._node_states[health.node] = said
            if health.detail:
                named = health.detail.startswith(f"{health.node}:")
                line = health.detail if named else f"{health.node}: {health.detail}"
                self.state.add_notice("radixtop", "error", line)
            elif health.state == "streaming" and health.node in self._node_streamed:
                self.state.add_message([f"{health.node}: its log stream is back"])
            elif health.state == "streaming":
                self._node_streamed.add(health.node)
                self.state.add_message([f"{health.node}: following its logs through ssh ({health.clock}); "
                                        f"{health.forwards} endpoint(s) forwarded to this node's loopback"])

    def stop_nodes(self) -> None:
        if self.nodes is not None:
            self.nodes.stop()
