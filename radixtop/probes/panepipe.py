"""The command `tmux pipe-pane` runs for radixtop: copy the pane's output (stdin) to a spool file
while radixtop lives. It ends by itself when radixtop's process is gone or the spool file is removed,
so a radixtop killed without its clean-up (its pane closed, SIGKILL) leaves no pipe running in the
user's tmux (tmux closes a pane's pipe when its command exits). Standard library only: it runs as a
script, `python -I panepipe.py PID FILE`, never importing from the pane's working directory.
"""

from __future__ import annotations

import os
import select
import sys

CHECK_S = 1.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def copy(pid: int, path: str, source: int = 0) -> None:
    out = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        while _alive(pid) and os.path.exists(path):
            ready, _, _ = select.select([source], [], [], CHECK_S)
            if ready:
                data = os.read(source, 65536)
                if not data:
                    return
                os.write(out, data)
    finally:
        os.close(out)


if __name__ == "__main__":
    copy(int(sys.argv[1]), sys.argv[2])
