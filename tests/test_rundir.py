"""radixtop's runtime directory and the one way its files are written and read: a directory open
to others is refused and left as it was, a write never goes through a planted link, a read never
takes a link, a FIFO or another user's file. Another user is uid 65534 (nobody), as root runs
these tests here."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from radixtop.incident.common.sighting import Sighting, load_sighting, save_sighting
from radixtop.incident.confirm.runlock import RunLock, read_status
from radixtop.rundir import RuntimeDirError, read_file, runtime_dir, write_file

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")
URL = "http://127.0.0.1:31999"


@pytest.mark.parametrize("mode", [0o1777, 0o2775, 0o777, 0o750])
def test_a_directory_open_to_others_is_refused_and_never_chmoded(tmp_path: Path, monkeypatch, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv("RADIXTOP_RUNTIME_DIR", str(shared))
    with pytest.raises(RuntimeDirError, match="open to other users"):
        runtime_dir()
    assert stat.S_IMODE(shared.stat().st_mode) == mode
    with pytest.raises(RuntimeDirError):
        save_sighting(Sighting(url=URL, first_seen=1.0, last_seen=1.0))
    assert load_sighting(URL) is None


def test_planted_files_in_a_directory_that_was_open_are_never_read(tmp_path: Path, monkeypatch) -> None:
    """A sighting planted while the directory was world-writable (its cwd, env and argv
    would be run) is not trusted: the directory is refused as it stands."""
    base = tmp_path / "rt"
    (base / "servers").mkdir(parents=True)
    base.chmod(0o777)
    (base / "servers").chmod(0o777)
    doc = {"schema": 1, "url": URL, "first_seen": 1, "last_seen": 2, "argv": ["python3", "-m", "sglang.launch_server"],
           "cwd": "/tmp/evil", "env": {"LD_PRELOAD": "/tmp/evil.so"}}
    (base / "servers" / "127.0.0.1-31999.json").write_text(json.dumps(doc))
    monkeypatch.setenv("RADIXTOP_RUNTIME_DIR", str(base))
    assert load_sighting(URL) is None
    assert stat.S_IMODE(base.stat().st_mode) == 0o777


def test_a_sighting_read_back_keeps_only_behaviour_keys(runtime_dir: Path) -> None:
    save_sighting(Sighting(url=URL, first_seen=1.0, last_seen=2.0, env={"SGLANG_X": "1"}))
    path = runtime_dir / "servers" / "127.0.0.1-31999.json"
    doc = json.loads(path.read_text())
    doc["env"] = {"SGLANG_X": "1", "LD_PRELOAD": "/tmp/evil.so", "PYTHONSTARTUP": "/tmp/x.py"}
    path.write_text(json.dumps(doc))
    seen = load_sighting(URL)
    assert seen is not None and dict(seen.env) == {"SGLANG_X": "1"}


def test_writes_never_follow_a_planted_link(runtime_dir: Path, tmp_path: Path) -> None:
    """Links planted where the temporary files used to go (.NAME.PID.tmp), and at the file
    itself: the victim is untouched, the link replaced by the file."""
    victim = tmp_path / "victim.txt"
    victim.write_text("root's important file\n")
    servers = runtime_dir / "servers"
    servers.mkdir(mode=0o700)
    for pid in range(os.getpid(), os.getpid() + 200):
        os.symlink(victim, servers / f".127.0.0.1-31999.json.{pid}.tmp")
        os.symlink(victim, runtime_dir / f".confirm-status.json.{pid}.tmp")
    os.symlink(victim, servers / "127.0.0.1-31999.json")
    path = save_sighting(Sighting(url=URL, first_seen=1.0, last_seen=2.0))
    lock = RunLock(URL, tmp_path)
    assert lock.acquire()
    try:
        lock.note("plan", "a line")
    finally:
        lock.release()
    assert victim.read_text() == "root's important file\n"
    assert path.is_file() and not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_status() is not None


def test_a_fifo_or_a_link_where_state_is_read_is_skipped_at_once(runtime_dir: Path, tmp_path: Path) -> None:
    """A FIFO at the sighting's or the status file's path no longer hangs a reader."""
    (runtime_dir / "servers").mkdir(mode=0o700)
    os.mkfifo(runtime_dir / "servers" / "127.0.0.1-31999.json")
    os.mkfifo(runtime_dir / "confirm-status.json")
    began = time.monotonic()
    assert load_sighting(URL) is None and read_status() is None
    assert time.monotonic() - began < 5
    target = tmp_path / "secret.json"
    target.write_text("{}")
    os.symlink(target, tmp_path / "link.json")
    assert read_file(tmp_path / "link.json", 100) is None
    assert read_file(target, 1) is None  # over the limit
    assert read_file(target, 100) == b"{}"


@as_root
def test_another_users_file_is_not_read_as_ours(tmp_path: Path) -> None:
    path = tmp_path / "planted.json"
    path.write_text("{}")
    os.chown(path, 65534, 65534)
    assert read_file(path, 100) is None


def test_write_file_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_file(path, b"one")
    write_file(path, b"two")
    assert path.read_bytes() == b"two" and sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_write_the_disk_refuses_leaves_no_temporary_file(tmp_path: Path) -> None:
    # The flight recorder writes a dying rank's record through write_file: a full disk must leave
    # neither a half record nor an empty temporary behind. A child process whose file size limit
    # is 4 KiB meets the same refusal (EFBIG) as one whose disk is full (ENOSPC).
    import errno
    import subprocess
    import sys

    code = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from radixtop.rundir import write_file\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n"
        "    write_file(Path(sys.argv[1]) / 'record.json', b'x' * (1 << 20))\n"
        "except OSError as exc:\n"
        "    print(exc.errno)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == str(errno.EFBIG), done
    assert list(tmp_path.iterdir()) == []
