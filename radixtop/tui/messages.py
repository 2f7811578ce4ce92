"""What the incident actions' threads tell the app: typed Textual messages, posted from any thread.

A bundle, a look at the live server and arming its crash dump each run in a thread worker
(tui/actions.py); when one has something to show, it posts one of these to the app, and the app's
handler (`on_bundle_taken`, ...) shows it on the UI loop. Posting is safe from any thread and does
nothing once the app has gone. The confirmation run's events do not come this way (the app's
message queue waits while q waits for a cancelled run: IncidentActions._post says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from radixtop.incident.bundle.bundle import BundleProgress, BundleResult
    from radixtop.incident.common.sighting import Sighting


@dataclass
class BundleProgressed(Message):
    """A bundle taken with b has done one more of its steps."""

    progress: BundleProgress


@dataclass
class BundleTaken(Message):
    """A bundle taken with b is written (`result`) or failed (`error`, one line)."""

    result: BundleResult | None
    error: str | None


@dataclass
class AutoBundleTaken(Message):
    """The bundle taken by itself at a finding is written (`result`) or failed (`error`)."""

    result: BundleResult | None
    error: str | None


@dataclass
class ServerSighted(Message):
    """What was seen of the live server (or its death) is noted and saved; None: nothing new."""

    seen: Sighting | None


@dataclass
class CrashDumpArmed(Message):
    """The live server was asked to dump its requests into `folder`: done, or `error`."""

    folder: str
    error: str | None
