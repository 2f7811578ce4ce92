"""A bundle never runs a program that the watched server names: only the interpreter the kernel
says it runs, and only when that file and its directory belong to us or root and no one else can
write them. Real server processes on loopback, real files and permissions."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
from hardening_helpers import argv_of, start_standin

from radixtop.incident.bundle.bundle import take_bundle


def _bundle(tmp_path: Path, pid: int) -> Path:
    return take_bundle(tmp_path / "out", pid=pid, archive=False, torch_env_timeout_s=30).path


def _commands(root: Path) -> list[dict]:
    return json.loads((root / "MANIFEST.json").read_text())["commands"]


def test_a_program_named_by_the_servers_argv0_is_never_run(tmp_path: Path) -> None:
    """`exec -a /some/dir/python python3 server.py`: argv[0] names a program of the server's
    choosing; the bundle must not run it (as `-m torch.utils.collect_env`, or any other way)."""
    marker = tmp_path / "ran"
    evil_dir = tmp_path / "evil"
    evil_dir.mkdir()
    evil = evil_dir / "python"
    evil.write_text(f"#!/bin/sh\necho ran > {marker}\n")
    evil.chmod(0o755)
    server = start_standin(tmp_path / "srv", argv0=str(evil))
    try:
        assert argv_of(server.pid)[0] == str(evil)  # the claim is in place
        root = _bundle(tmp_path, server.pid)
    finally:
        server.stop()
    assert not marker.exists(), "the bundle ran the program the server's argv[0] names"
    argvs = [c["argv"] for c in _commands(root)]
    assert argvs and all(str(evil) not in a for a in argvs)
    collect_env = next(c for c in _commands(root) if c["for"] == "env/collect_env.txt")
    assert os.path.realpath(collect_env["argv"][0]) == os.path.realpath(sys.executable)
    assert "README.txt" in {p.name for p in root.iterdir()}
    assert "torch.utils.collect_env" in (root / "README.txt").read_text()  # what ran, said in the bundle


def test_an_interpreter_others_can_write_is_not_run_and_the_bundle_says_why(tmp_path: Path) -> None:
    from radixtop.incident.common.server import server_interpreter

    shared = tmp_path / "shared"
    shared.mkdir()
    copy = shared / "python3"
    shutil.copy2(os.path.realpath(sys.executable), copy)
    shared.chmod(0o777)  # anyone can replace the interpreter in here
    server = start_standin(tmp_path / "srv", python=str(copy))
    try:
        python, why = server_interpreter(server.pid)
        assert python is None and "writable by group or others" in why
        root = _bundle(tmp_path, server.pid)
    finally:
        server.stop()
    note = (root / "env/collect_env.txt.note.txt").read_text()
    assert "not run" in note and str(shared) in note and "writable by group or others" in note
    assert all(c["for"] != "env/collect_env.txt" for c in _commands(root))


def test_trust_rule_checks_owner_and_write_bits_of_the_file_and_its_directory(tmp_path: Path) -> None:
    from radixtop.incident.common.server import executable_trust

    tool = tmp_path / "bin" / "tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    tool.parent.chmod(0o755)
    assert executable_trust(str(tool)) is None
    tool.chmod(0o775)
    assert "writable by group or others" in executable_trust(str(tool))
    tool.chmod(0o755)
    tool.parent.chmod(0o757)
    assert str(tool.parent) in executable_trust(str(tool))
    tool.parent.chmod(0o755)
    if os.geteuid() == 0:  # as root, a file of another user is refused
        os.chown(tool, 65534, 65534)
        assert "uid 65534" in executable_trust(str(tool))
    venv_cfg = tmp_path / "pyvenv.cfg"  # the interpreter's home, for a venv's python
    venv_cfg.write_text("home = /usr/bin\n")
    venv_cfg.chmod(0o666)
    link = tmp_path / "bin" / "python"
    link.symlink_to(os.path.realpath(sys.executable))
    assert "pyvenv.cfg" in executable_trust(str(link))
    assert stat.S_IMODE(os.stat(tool.parent).st_mode) == 0o755


def test_collect_env_runs_isolated_so_the_current_directory_adds_no_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `torch/` package in the directory radixtop runs from (a log directory) is not imported."""
    marker = tmp_path / "imported"
    pkg = tmp_path / "cwd" / "torch" / "utils"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "collect_env.py").write_text("print('fake collect_env')\n")
    monkeypatch.chdir(tmp_path / "cwd")
    server = start_standin(tmp_path / "srv")
    try:
        root = _bundle(tmp_path, server.pid)
    finally:
        server.stop()
    assert not marker.exists()
    collect_env = next(c for c in _commands(root) if c["for"] == "env/collect_env.txt")
    assert collect_env["argv"][1] == "-I"
