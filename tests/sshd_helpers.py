"""Real OpenSSH servers on loopback for the --node tests: `/usr/sbin/sshd -D -e` with a generated
config, host key and authorized_keys, everything in the test's tmp_path, and an ssh client config
(`ssh -F`) naming the test's identity and its own known_hosts.

The "remote" node's radixtop is this checkout's: sshd's `SetEnv` puts a folder on the session's
PATH holding a `radixtop` script that runs this interpreter on this checkout, so `ssh HOST --
radixtop discover --json` really runs radixtop through ssh and a login shell's PATH lookup. A node
"without radixtop" gets a PATH without that folder.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SSHD = "/usr/sbin/sshd"
PLAIN_PATH = "/usr/local/bin:/usr/bin:/bin"


def require_openssh() -> None:
    """Skip, saying why, where sshd or the ssh client is missing (.ci/run installs both)."""
    if not os.access(SSHD, os.X_OK):
        pytest.skip(f"{SSHD} is not installed (apt-get install openssh-server); .ci/run installs it")
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install openssh-client)")


def keygen(path: Path) -> str:
    """A new ed25519 key pair at path (and path.pub); the public key's line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "radixtop-test", "-f", str(path)],
                   check=True, timeout=30, capture_output=True)
    return path.with_suffix(".pub").read_text().strip()


def free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def radixtop_bin(folder: Path) -> Path:
    """A folder with a `radixtop` that runs this checkout with this interpreter."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "radixtop"
    script.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m radixtop "$@"\n')
    script.chmod(0o755)
    return folder


@dataclass
class Sshd:
    ip: str
    port: int
    host_key_line: str  # "ssh-ed25519 AAAA..." as known_hosts holds it
    proc: subprocess.Popen
    log: Path

    def known_hosts_line(self) -> str:
        return f"[{self.ip}]:{self.port} {self.host_key_line}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_sshd(workdir: Path, ip: str, authorized: list[str], session_path: str, timeout_s: float = 10.0) -> Sshd:
    """sshd on ip:free port, admitting the keys in `authorized` (and asking passwords of the rest,
    where a client would type one), its sessions' PATH `session_path`."""
    workdir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:  # privilege separation's chroot; a non-root sshd runs without it
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    host_key = workdir / "host_ed25519"
    host_line = " ".join(keygen(host_key).split()[:2])
    (workdir / "authorized_keys").write_text("".join(k + "\n" for k in authorized))
    port = free_port(ip)
    config = workdir / "sshd_config"
    config.write_text(
        f"ListenAddress {ip}\nPort {port}\nHostKey {host_key}\nPidFile {workdir / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {workdir / 'authorized_keys'}\nStrictModes no\nUsePAM no\n"
        "PubkeyAuthentication yes\nPasswordAuthentication yes\nKbdInteractiveAuthentication no\n"
        f"PermitRootLogin yes\nAllowUsers {getpass.getuser()}\nPrintMotd no\nX11Forwarding no\n"
        f"SetEnv PATH={session_path}\nLogLevel VERBOSE\n"
    )
    log = workdir / "sshd.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = Sshd(ip, port, host_line, proc, log)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited ({proc.returncode}): {log.read_text()[-800:]}")
        try:
            with socket.create_connection((ip, port), timeout=0.5):
                return server
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"sshd did not listen in {timeout_s} s: {log.read_text()[-800:]}") from None
            time.sleep(0.05)


def client_config(path: Path, hosts: dict[str, tuple[Sshd, Path]], known_hosts: Path,
                  checking: str = "yes") -> Path:
    """An ssh client config: one `Host ALIAS` per (sshd, identity file), this user, only that
    identity (no agent), known hosts in `known_hosts` alone."""
    blocks = []
    for alias, (server, identity) in hosts.items():
        blocks.append(
            f"Host {alias}\n  HostName {server.ip}\n  Port {server.port}\n  User {getpass.getuser()}\n"
            f"  IdentityFile {identity}\n  IdentitiesOnly yes\n  IdentityAgent none\n"
            f"  UserKnownHostsFile {known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
            f"  StrictHostKeyChecking {checking}\n"
        )
    path.write_text("\n".join(blocks))
    return path
