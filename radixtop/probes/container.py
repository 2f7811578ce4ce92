"""A server in a container (docker, podman, containerd): the process is visible on the node, but the
paths on its command line and its file descriptors are in the container's filesystem, and its ports
in the container's network.
- files: read through /proc/PID/root/<path> (the container's root as the kernel shows it; needs the
  rights to read that process, as root has);
- its output when it goes to the runtime: the runtime's log file (docker's json-file
  /var/lib/docker/containers/ID/ID-json.log, podman's k8s-file .../overlay-containers/ID/userdata/ctr.log)
  when readable, else `docker logs -f ID` / `podman logs -f ID` when that CLI reaches its daemon;
- ports: those it listens on in its own network (/proc/PID/net/tcp, tcp6), reached through the
  host port the runtime publishes them on, read from docker-proxy's command line; only loopback is
  asked (a port published on 0.0.0.0 or 127.0.0.1).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psutil

_ID = re.compile(r"(docker|libpod|crio|cri-containerd|containerd)[-/:]([0-9a-f]{64})(?:\.scope)?")
_RUNTIME = {"docker": "docker", "libpod": "podman", "crio": "cri-o", "cri-containerd": "containerd",
            "containerd": "containerd"}
_LISTEN = "0A"
_CLI_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class Container:
    pid: int
    runtime: str  # "docker" | "podman" | "containerd" | "cri-o" | "" (unknown: only the root differs)
    id: str  # the container id (64 hex), "" when unknown
    own_root: bool  # its filesystem root is not ours
    own_net: bool  # its network namespace is not ours

    @property
    def name(self) -> str:
        what = self.runtime or "a"
        return f"{what} container {self.id[:12]}" if self.id else f"{what} container (pid {self.pid})"

    def host_path(self, path: str) -> str:
        """Where a path of the container's is on this node: resolved inside the container's root,
        so a link in it (an absolute one included) never leads to a file of the node's."""
        if not (self.own_root and path.startswith("/")):
            return path
        root = f"/proc/{self.pid}/root"
        return root + resolve_in_root(root, path)


MAX_LINKS = 40  # as the kernel's path walk


def resolve_in_root(root: str, path: str) -> str:
    """`path` with every link resolved as if `root` were /, as openat2's RESOLVE_IN_ROOT does:
    an absolute link restarts at `root`, `..` stops at it. The kernel resolves an absolute link
    under /proc/PID/root against the reader's root, so a container could otherwise point its log
    at any file of the node. A component that cannot be read is kept as it is (the open fails)."""
    todo = [p for p in path.split("/") if p]
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = "/" + "/".join([*done, part])
        try:
            target = os.readlink(root + here)
        except OSError:  # not a link, or not there: taken as named
            done.append(part)
            continue
        links += 1
        if links > MAX_LINKS:
            raise OSError(f"too many links resolving {path} in {root}")
        if target.startswith("/"):
            done = []
        todo = [p for p in target.split("/") if p] + todo
    return "/" + "/".join(done)


def _same(a: str, b: str) -> bool | None:
    """Whether two /proc links name the same namespace or root; None when one cannot be read."""
    try:
        if a.endswith("/root"):
            sa, sb = os.stat(a), os.stat(b)
            return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)
        return os.readlink(a) == os.readlink(b)
    except OSError:
        return None


def container_of(pid: int, cgroup: str) -> Container | None:
    """The container the process runs in (from its cgroup and its root and network namespace),
    or None when it shares ours."""
    m = _ID.search(cgroup)
    runtime, cid = (_RUNTIME[m.group(1)], m.group(2)) if m else ("", "")
    root_same = _same(f"/proc/{pid}/root", "/proc/self/root")
    net_same = _same(f"/proc/{pid}/ns/net", "/proc/self/ns/net")
    if not m and root_same in (True, None):
        return None
    return Container(pid, runtime, cid, own_root=root_same is False or (root_same is None and bool(m)),
                     own_net=net_same is False)


def readable_root(container: Container) -> str:
    """"" when the container's files can be read through /proc/PID/root; else why not."""
    try:
        os.listdir(f"/proc/{container.pid}/root/")
    except PermissionError:
        return "permission denied"
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


# -- ports ------------------------------------------------------------------------------------


def _hex_addr(text: str) -> tuple[str, int]:
    addr, port = text.split(":")
    raw = bytes.fromhex(addr)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four little-endian 32-bit words
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return ip, int(port, 16)


def listening_in(pid: int) -> tuple[list[tuple[str, int]], str]:
    """The TCP ports listening in the process's network namespace, and why none could be read."""
    found: list[tuple[str, int]] = []
    why = ""
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}", encoding="ascii", errors="replace") as f:
                rows = f.read(4 * 1024 * 1024).splitlines()[1:]
        except PermissionError:
            why = "permission denied"
            continue
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 3 and cols[3] == _LISTEN:
                try:
                    found.append(_hex_addr(cols[1]))
                except ValueError:
                    continue
    return sorted(set(found), key=lambda a: a[1]), why


def published(container_ports: Iterable[int], processes: Iterable[Sequence[str]] | None = None) -> dict[int, int]:
    """container port -> a host port on loopback that reaches it, from docker-proxy's command lines
    (`docker-proxy -proto tcp -host-ip 0.0.0.0 -host-port 8080 -container-ip 172.17.0.2
    -container-port 30000`). Only ports published on 0.0.0.0, :: or 127.0.0.1 (radixtop asks
    nothing but loopback)."""
    wanted = set(container_ports)
    if processes is None:
        processes = _proxy_command_lines()
    out: dict[int, int] = {}
    for argv in processes:
        if not argv or os.path.basename(argv[0]) != "docker-proxy":
            continue
        flags = {argv[i]: argv[i + 1] for i in range(1, len(argv) - 1) if argv[i].startswith("-")}
        try:
            cport, hport = int(flags.get("-container-port", "")), int(flags.get("-host-port", ""))
        except ValueError:
            continue
        if (
            flags.get("-proto", "tcp") == "tcp"
            and cport in wanted
            and flags.get("-host-ip", "0.0.0.0") in ("0.0.0.0", "::", "127.0.0.1")
        ):
            out.setdefault(cport, hport)
    return out


def _proxy_command_lines() -> list[list[str]]:
    lines = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info.get("cmdline")
        if argv and os.path.basename(argv[0]) == "docker-proxy":
            lines.append(argv)
    return lines


# -- the runtime's log ------------------------------------------------------------------------


def runtime_log_files(container: Container, uid: int | None = None) -> list[tuple[str, str]]:
    """(path, format) of the runtime's log file for the container, the likely ones first."""
    if not container.id:
        return []
    cid = container.id
    files = [(f"/var/lib/docker/containers/{cid}/{cid}-json.log", "docker-json")]
    storage = ["/var/lib/containers/storage"]
    if uid is not None:
        try:
            storage.append(os.path.join(pwd.getpwuid(uid).pw_dir, ".local/share/containers/storage"))
        except KeyError:
            pass
    files += [(f"{base}/overlay-containers/{cid}/userdata/ctr.log", "k8s-file") for base in storage]
    if container.runtime == "podman":
        files = files[1:] + files[:1]
    return files


def logs_argv(container: Container, tail: int = 5_000) -> list[str] | None:
    """`docker logs -f --tail N ID` (or podman's) when that CLI answers for this container."""
    cli = {"docker": "docker", "podman": "podman"}.get(container.runtime)
    exe = shutil.which(cli) if cli else None
    if exe is None or not container.id:
        return None
    try:
        got = subprocess.run([exe, "inspect", "--format", "{{.Id}}", container.id], capture_output=True, text=True,
                             timeout=_CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if got.returncode != 0:
        return None
    return [exe, "logs", "-f", "--tail", str(tail), container.id]


def container_ports(container: Container) -> tuple[list[tuple[str, int]], list[str]]:
    """The loopback addresses on this node that reach the ports the container listens on, and
    the lines saying what could not be reached."""
    inside, why = listening_in(container.pid)
    if why and not inside:
        return [], [f"cannot read the ports of {container.name} ({why}): run radixtop as root, or pass --url"]
    ports = sorted({port for _, port in inside})
    if not ports:
        return [], []
    mapping = published(ports)
    addrs = [("127.0.0.1", mapping[p]) for p in ports if p in mapping]
    unmapped = [p for p in ports if p not in mapping]
    problems = []
    if unmapped and not addrs:
        shown = ", ".join(str(p) for p in unmapped[:6])
        cli = container.runtime if container.runtime in ("docker", "podman") else "docker"
        problems.append(
            f"it listens on {shown} inside the network of {container.name}, published on no loopback port radixtop "
            f"can see: pass --url http://127.0.0.1:PORT with the port it is published on (`{cli} port "
            f"{container.id[:12] or 'ID'}`)"
        )
    return addrs, problems
