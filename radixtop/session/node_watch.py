"""Other nodes watched from this one (`radixtop --node HOST`): each reached once through the user's
ssh (probes/remote.py: its report and its clock against this one), then linked (probes/node_link.py:
its logs into spool files here, its endpoints forwarded to loopback ports here).

`connect_nodes` runs before the UI starts, so the log pane follows the spools from its first frame
and the findings know which node wrote each file and how far its clock is off. A node that cannot
be reached is one line (`NodeWatch.failures`), and the others go on. The spools live in a folder
of this process's own under the runtime directory (probes/spool.py), removed at `stop()`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from radixtop.diagnosis.findings import NodeClock
from radixtop.probes.node_link import LinkHealth, NodeGpus, NodeLink
from radixtop.probes.remote import reach_all
from radixtop.probes.spool import Spool
from radixtop.rundir import runtime_dir

__all__ = ["NodeWatch", "connect_nodes"]


@dataclass
class NodeWatch:
    links: list[NodeLink] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (host, one line) per node not reached
    spool: Spool | None = None  # the spool files' folder, this process's own

    def patterns(self) -> list[str]:
        return [link.spool_pattern for link in self.links]

    def node_of(self, file: str) -> NodeClock | None:
        """The node whose spool `file` is, and its clock's correction; None for this node's files."""
        for link in self.links:
            if file.startswith(f"{link.spool_dir}{os.sep}"):
                return link.clock()
        return None

    def instruments(self) -> tuple[tuple[str, str], ...]:
        """Each node's forwarded debug endpoints: (the URL here, the node)."""
        pairs = [(link, url) for link in self.links for url in link.instrument_urls()]
        return tuple((local, link.name) for link, url in pairs if (local := link.local_url(url)) is not None)

    def flight_dirs(self) -> tuple[str, ...]:
        return tuple(str(link.flight_dir) for link in self.links)

    def gpus(self) -> list[NodeGpus]:
        return [g for link in self.links if (g := link.gpus()) is not None]

    def health(self) -> list[LinkHealth]:
        return [link.health() for link in self.links]

    def stop(self) -> None:
        for link in self.links:
            link.stop()
        if self.spool is not None:
            self.spool.close()


def connect_nodes(
    hosts: Sequence[str], *, urls: Mapping[str, str] | None = None, ssh_config: str | None = None,
    command: str = "radixtop", timeout_s: float = 30.0, say: Callable[[str], None] = lambda line: None,
) -> NodeWatch:
    """Reach every node at once (each within `timeout_s`), then link those that answered, each to
    the server `urls` names there (else every one found)."""
    say(f"radixtop: reaching {', '.join(hosts)} through ssh …")
    answers = asyncio.run(reach_all(hosts, ssh_config=ssh_config, timeout_s=timeout_s, command=command))
    watch = NodeWatch()
    for answer in answers:
        if not answer.ok:
            watch.failures.append((answer.host, answer.error))
            say(f"radixtop: {answer.error}")
            continue
        if watch.spool is None:
            watch.spool = Spool(base=str(runtime_dir("nodes")))
        link = NodeLink(answer, watch.spool, (urls or {}).get(answer.host), ssh_config=ssh_config, command=command)
        link.start()
        watch.links.append(link)
    return watch

