"""Files the user names (a signature catalog, a keymap) that are not files: a FIFO would block the
reader for ever, /dev/zero would fill memory. Each is refused at once in one line, and the TUI
starts with its defaults."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from radixtop.tui.keys import load_keymap


def test_scan_refuses_a_fifo_or_a_device_as_its_signature_file(tmp_path: Path) -> None:
    fifo = tmp_path / "signatures.toml"
    os.mkfifo(fifo)
    log = tmp_path / "server.log"
    log.write_text("[2026-12-05 10:00:00] hello\n")
    for given in (str(fifo), "/dev/zero"):
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "radixtop", "scan", "--signatures", given, str(log)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and time.monotonic() - began < 30, done
        assert done.stderr.strip() == f"radixtop: {given}:1: not a regular file (a FIFO or a device?); give a file"


def test_a_fifo_as_the_keymap_is_one_notice_and_the_default_keys(tmp_path: Path) -> None:
    fifo = tmp_path / "keymap.toml"
    os.mkfifo(fifo)
    began = time.monotonic()
    keymap, problem = load_keymap(fifo)
    assert time.monotonic() - began < 5
    assert keymap == {} and problem is not None and "not a regular file" in problem and "default keys" in problem
