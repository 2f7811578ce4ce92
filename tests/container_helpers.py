"""A process in a container of its own, for the container tests, made with what the kernel offers
(docker's daemon does not run here): `unshare --mount [--net] --fork`, then a root of its own
(chroot into a directory holding bind mounts of what Python needs and a tmpfs at /logs, which exists
only inside). Its files are then reachable from the node only through /proc/PID/root, and with
--net its ports only inside its network, as for a docker container. A `docker-proxy` stand-in
publishes a port of it on the node's loopback as docker's userland proxy does, with its command line
(`docker-proxy -proto tcp -host-ip 127.0.0.1 -host-port H -container-ip ... -container-port P`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STAND_IN = textwrap.dedent(
    """
    import os, subprocess, sys

    root = sys.argv[1]
    sep = sys.argv.index("--")
    binds, argv = sys.argv[2:sep], sys.argv[sep + 1:]

    def run(*a):
        subprocess.run(list(a), check=True)

    run("mount", "--make-rprivate", "/")
    for src in ["/usr", "/etc", "/dev", *binds]:
        os.makedirs(root + src, exist_ok=True)
        run("mount", "--rbind", src, root + src)
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink("/" + link) and not os.path.lexists(os.path.join(root, link)):
            os.symlink(os.readlink("/" + link), os.path.join(root, link))
    for d in ("proc", "logs", "tmp"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    run("mount", "-t", "tmpfs", "tmpfs", root + "/logs")
    run("mount", "-t", "proc", "proc", root + "/proc")
    if os.environ.get("STAND_IN_NET") == "1":
        run("ip", "link", "set", "lo", "up")
    os.chroot(root)
    os.chdir("/")
    os.execv(argv[0], argv)
    """
)

PROXY = textwrap.dedent(
    """
    # docker-proxy's command line; forwards the node's loopback port into the container's network.
    import ctypes, os, socket, sys, threading

    flags = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    listener = socket.create_server((flags["-host-ip"], int(flags["-host-port"])))
    fd = os.open(f"/proc/{os.environ['CONTAINER_PID']}/ns/net", os.O_RDONLY)
    if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:  # CLONE_NEWNET: sockets made from now on
        raise SystemExit("setns failed")
    print("ready", flush=True)

    def pump(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            b.close()

    while True:
        client, _ = listener.accept()
        upstream = socket.create_connection((flags["-container-ip"], int(flags["-container-port"])))
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
    """
)


def can_make_containers() -> str:
    """"" when unshare, mount, chroot and ip work here; else why not."""
    for tool in ("unshare", "mount", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    got = subprocess.run(["unshare", "--mount", "--net", "--fork", "true"], capture_output=True, text=True, timeout=10)
    return "" if got.returncode == 0 else f"unshare: {got.stderr.strip()[:200]}"


def start_container(where: Path, argv: list[str], *, net: bool = False) -> subprocess.Popen:
    """Run argv in a container of its own rooted at where/root; the unshare process (the server is
    its child)."""
    where.mkdir(parents=True, exist_ok=True)
    script = where / "stand_in.py"
    script.write_text(STAND_IN)
    root = where / "root"
    root.mkdir(exist_ok=True)
    python_home = str(Path(os.path.realpath(sys.executable)).parent.parent)
    binds = sorted({python_home, str(ROOT)})
    env = {**os.environ, "STAND_IN_NET": "1" if net else "0"}
    return subprocess.Popen(
        ["unshare", "--mount", *(["--net"] if net else []), "--fork", sys.executable, str(script), str(root), *binds,
         "--", *argv],
        stdout=open(where / "out.txt", "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,  # noqa: SIM115
        start_new_session=True,
    )


def server_in(container: subprocess.Popen, timeout_s: float = 20) -> int:
    """The pid of the process the stand-in exec'd (the unshare's child)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        kids = psutil.Process(container.pid).children()
        if kids and "stand_in.py" not in " ".join(kids[0].cmdline()):
            return kids[0].pid
        time.sleep(0.05)
    raise RuntimeError("the container's process did not start")


def read_inside(pid: int, path: str, timeout_s: float = 30) -> str:
    """A file of the container's, through /proc/PID/root, once it has content."""
    deadline = time.monotonic() + timeout_s
    host = f"/proc/{pid}/root{path}"
    while time.monotonic() < deadline:
        try:
            text = Path(host).read_text()
            if text.strip():
                return text
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{host} stayed empty")


def start_proxy(where: Path, container_pid: int, container_port: int, host_port: int) -> subprocess.Popen:
    script = where / "proxy.py"
    script.write_text(PROXY)
    proc = subprocess.Popen(
        ["docker-proxy", str(script), "-proto", "tcp", "-host-ip", "127.0.0.1", "-host-port", str(host_port),
         "-container-ip", "127.0.0.1", "-container-port", str(container_port)],
        executable=sys.executable, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "CONTAINER_PID": str(container_pid)}, start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.strip() == "ready", line
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()
