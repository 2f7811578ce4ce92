"""The environment and working directory of a server radixtop starts.

A started server runs as the user who pressed `c`, often root, so nothing another user chose may
run in it: it gets a clean environment (a few keys of radixtop's own, then the live server's
behaviour keys), every directory on a code-loading path (PATH, PYTHONPATH, LD_LIBRARY_PATH) held
to the ownership rule (`server.directory_trust`), and a working directory that passes the same rule (else the
run's own). `--inherit-env` gives the server's whole environment instead, as the
user's explicit choice. What was carried and what was left out is shown in the plan.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from radixtop.incident.common.redact import Redactor
from radixtop.incident.common.server import directory_trust, executable_trust
from radixtop.incident.common.sighting import behaviour_env

__all__ = ["LaunchEnv", "OWN_KEYS", "launch_env", "untrusted_module"]

# radixtop's own keys every started server gets (where it runs, who it is, how it speaks);
# the live server's behaviour keys are laid over them.
OWN_KEYS = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
# Keys whose directories decide which code runs: each entry is held to the ownership rule.
CODE_PATHS = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH")
# Keys that name places: the plan names them without their (long) values.
LOCATION_KEYS = (*CODE_PATHS, "HOME", "TMPDIR", "VIRTUAL_ENV", "CONDA_PREFIX", "XDG_RUNTIME_DIR")
SHOWN_CHARS = 300  # of the carried settings in the plan; plan.json has every key


@dataclass(frozen=True)
class LaunchEnv:
    """What a started server runs with, and the account of it the plan shows."""

    env: dict[str, str]
    """The whole environment the server gets."""
    cwd: str
    """Its working directory."""
    carried: tuple[str, ...]
    """The live server's keys carried into it (all of them with --inherit-env)."""
    dropped: tuple[str, ...]
    """What was left out and why, one line each (an untrusted directory, a working directory)."""
    inherited: bool
    """True when the server's whole environment was given (--inherit-env)."""

    def describe(self, redactor: Redactor) -> list[str]:
        if self.inherited:
            head = f"Environment   the server's whole environment, {len(self.env)} keys (--inherit-env)"
        else:
            head = (f"Environment   clean: radixtop's {', '.join(k for k in OWN_KEYS if k in self.env)}, "
                    f"and the server's {len(self.carried)} behaviour keys")
        lines = [head]
        if not self.inherited:
            # Settings with their values; directories by name (long, and checked above).
            named = [k for k in self.carried if k in self.env and k in LOCATION_KEYS]
            shown = redactor.env({k: self.env[k] for k in self.carried if k in self.env and k not in LOCATION_KEYS})
            said = " ".join([*(f"{k}={v}" for k, v in sorted(shown.items())), *(f"{k}=(the server's)" for k in named)])
            if said:
                lines.append(
                    "  " + (said if len(said) <= SHOWN_CHARS else said[:SHOWN_CHARS] + " … (all in plan.json)")
                )
        lines.append(f"  working directory: {self.cwd}")
        lines += [f"  left out: {d}" for d in self.dropped]
        return lines

    def module_problem(self, module: str) -> str | None:
        """Why `python -m module` must not run with this environment (its working directory
        and PYTHONPATH come before site-packages), or None."""
        roots = [self.cwd, *[p for p in self.env.get("PYTHONPATH", "").split(os.pathsep) if p]]
        return untrusted_module(module, roots)


def _trusted_dirs(value: str, key: str, dropped: list[str]) -> str:
    """The entries of a path list that radixtop may load code from: absolute, existing, and
    passing the ownership rule; the others are left out (an untrusted one is said)."""
    kept: list[str] = []
    for entry in value.split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            if entry:
                dropped.append(f"{key} entry {entry!r}: relative to wherever the server starts")
            continue
        if not os.path.isdir(entry):
            continue  # nothing there to load (a later mkdir by anyone is kept out below)
        why = directory_trust(entry)
        if why is not None:
            dropped.append(f"{key} entry {entry}: {why}")
            continue
        kept.append(entry)
    return os.pathsep.join(dict.fromkeys(kept))


def untrusted_module(module: str, roots: Sequence[str]) -> str | None:
    """Why `python -m module` must not run from these roots (the working directory and
    PYTHONPATH come before site-packages), or None: every file and package directory of the
    module found under a root must pass the ownership rule."""
    parts = module.split(".")
    for root in roots:
        for depth in range(1, len(parts) + 1):
            base = os.path.join(root, *parts[:depth])
            for candidate in (base, base + ".py", os.path.join(base, "__init__.py")):
                if os.path.exists(candidate):
                    why = executable_trust(candidate)
                    if why is not None:
                        return f"module {module} would load {candidate}: {why}"
    return None


def launch_env(
    server_env: Mapping[str, str] | None,
    own_env: Mapping[str, str],
    *,
    server_cwd: str | None,
    run_dir: str,
    inherit: bool = False,
) -> LaunchEnv:
    """The environment and working directory for a started server, from the live server's
    environment (None: never read) and radixtop's own."""
    dropped: list[str] = []
    if inherit and server_env is not None:
        env = dict(server_env)
        carried = tuple(sorted(env))
    else:
        behaviour = behaviour_env(server_env or {})
        env = {k: v for k, v in own_env.items() if k in OWN_KEYS}
        env.update(behaviour)
        carried = tuple(sorted(behaviour))
        for key in CODE_PATHS:
            if key in env:
                env[key] = _trusted_dirs(env[key], key, dropped)
                if not env[key]:
                    del env[key]
    cwd = run_dir
    if server_cwd:
        why = directory_trust(server_cwd) if os.path.isdir(server_cwd) else "it is gone"
        if why is None or inherit:
            cwd = server_cwd
        else:
            dropped.append(f"the server's working directory {server_cwd} ({why}): the servers start in {run_dir}")
    return LaunchEnv(env, cwd, carried, tuple(dropped), inherit and server_env is not None)
