"""A failed `ssh HOST -- radixtop ARGS` (discover --json, bundle --stream) as one line that says
what to do.

OpenSSH exits 255 for its own failures and says which on stderr (radixtop runs it with
LogLevel=ERROR, so those lines are there whatever the user's config says); otherwise the exit
status is the remote command's: 127 where the shell found no `radixtop`. The stderr read here
comes from another machine and a shell's startup files: only printable, cut, text of it is shown.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from radixtop.textsafe import printable_line

__all__ = ["explain_bad_answer", "explain_failure", "explain_timeout"]

NOT_FOUND = 127  # the shell's "command not found"

# (what ssh says, what it means and what to do); the first that matches wins.
_SSH_SAYS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key for", "has changed and you have requested strict checking"),
     "its host key changed since your known_hosts recorded it (a reinstalled node, or someone in between): "
     "check with whoever runs it, then `ssh-keygen -R {host}` and `ssh {host}` once to accept the new key"),
    (("No ED25519 host key is known", "No ECDSA host key is known", "No RSA host key is known",
      "host key is known for", "Host key verification failed"),
     "its host key is not in your known_hosts (BatchMode cannot ask): run `ssh {host}` once to check and accept it"),
    (("Permission denied", "Too many authentication failures", "no matching host key type"),
     "authentication needed: radixtop uses your ssh agent/keys; run `ssh {host}` once to check"),
    (("Could not resolve hostname", "Name or service not known", "nodename nor servname"),
     "unknown host name: check the name, or its Host entry in your ssh config"),
    (("Connection refused",),
     "connection refused: nothing listens on its ssh port (is sshd running there, is the port right?)"),
    (("Connection timed out", "Operation timed out", "timed out during banner exchange"),
     "unreachable: the ssh connection timed out (is the host up, and reachable from here?)"),
    (("No route to host", "Network is unreachable", "Host is unreachable"),
     "unreachable: no route to it from here (check the name, the VPN, the network)"),
    (("kex_exchange_identification", "Connection closed by", "Connection reset by"),
     "the ssh connection was closed before login (sshd refused it: a MaxStartups limit, a firewall, "
     "or no ssh server on that port)"),
    (("Bad configuration option", "Bad owner or permissions", "Can't open user config file",
      "no argument after keyword", "terminating, "),
     "your ssh config could not be used: {said}"),
)

_COMMAND_NOT_FOUND = ("command not found", "not found", "No such file or directory")
_DISCOVER = ("discover", "--json")


def explain_failure(host: str, returncode: int, stderr: str, command: str = "radixtop",
                    args: Sequence[str] = _DISCOVER) -> str:
    """One line for a finished ssh whose `command ARGS` failed (`returncode` its exit status)."""
    said = _last_words(stderr)
    if returncode == 255:
        for needles, meaning in _SSH_SAYS:
            if any(n in stderr for n in needles):
                return f"{host}: {meaning.format(host=host, said=said)}"
        return f"{host}: ssh failed (exit 255): {said or 'it said nothing'}; run `ssh {host}` to see why"
    if returncode == NOT_FOUND or (command in stderr and any(n in stderr for n in _COMMAND_NOT_FOUND)):
        return (f"{host}: radixtop is not installed there, or not on the PATH of a non-interactive ssh session: "
                f"install radixtop there, or pass --remote-radixtop /path/to/bin/radixtop")
    if returncode == 2 and f"invalid choice: '{args[0]}'" in stderr:
        return f"{host}: the radixtop there has no `{args[0]}` (an older version): upgrade it there"
    if returncode == 2 and "unrecognized arguments" in stderr:
        return f"{host}: the radixtop there does not take `{_shown(args)}` (an older version): upgrade it there"
    return f"{host}: `{command} {_shown(args)}` failed there (exit {returncode}): {said or 'it said nothing'}"


def explain_bad_answer(host: str, reason: str, command: str = "radixtop") -> str:
    """An answer that is not a node report (a shell startup file printing on stdout, another program)."""
    return (f"{host}: its answer is not radixtop's node report ({printable_line(reason, 160)}); "
            f"does a shell startup file print there? try `ssh {host} {command} discover --json`")


def explain_timeout(host: str, timeout_s: float, command: str = "radixtop", args: Sequence[str] = _DISCOVER) -> str:
    return (f"{host}: no answer within {timeout_s:g} s (ssh still connecting, or radixtop {args[0]} stuck there); "
            f"try `ssh {host} {command} {_shown(args)}`, or a longer --timeout")


def _shown(args: Sequence[str]) -> str:
    return printable_line(" ".join(shlex.quote(a) for a in args), 200)


def _last_words(stderr: str) -> str:
    """The last line ssh or the remote said that is not a warning, printable and cut."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith("Warning: Permanently added")]
    lines = [ln for ln in lines if not set(ln) <= {"@"} and not ln.startswith("@")]
    return printable_line(lines[-1], 200) if lines else ""
