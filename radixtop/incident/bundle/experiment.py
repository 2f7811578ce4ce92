"""The confirmation run's outcome, added to the bundle it began with.

A confirmation run takes its evidence bundle first, before anything is replayed; its verdict comes
minutes later. So that the post-mortem holds both, the run adds ``experiment/verdict.json`` (the
verdict as ``--json`` prints it, already redacted) and ``experiment/ladder.html`` (the steps and
the pressure ladder as a picture, offline in a browser) to that bundle. The files collected
before are not touched: the manifest and SHA256SUMS gain the two entries (the evidence's own
hashes stay as they were), and the archive beside the directory is written again.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from radixtop.incident.bundle.bundle import MANIFEST, SUMS, _sha256, _write_archive

__all__ = ["add_experiment", "ladder_html"]

VERDICT_FILE = "experiment/verdict.json"
LADDER_FILE = "experiment/ladder.html"
BAR_PX = 300  # the bar for token usage 1.0


def _bar(value: Any) -> str:
    width = 0 if not isinstance(value, (int, float)) else round(min(1.0, max(0.0, float(value))) * BAR_PX)
    return f'<span class="bar" style="width:{width}px"></span>'


def _rows(steps: Sequence[Mapping[str, Any]]) -> str:
    out = []
    for n, step in enumerate(steps, 1):
        failed = bool(step.get("signatures") or step.get("diverged"))
        usage = step.get("peak_token_usage")
        shown = "unknown" if not isinstance(usage, (int, float)) else f"{usage:.2f}"
        what = ", ".join([*step.get("signatures", []), *(f"diverged {r}" for r in step.get("diverged", []))])
        cell = "FAIL: " + what if failed else ("did not run: " + str(step.get("error")) if step.get("error")
                                                 else "clean")
        out.append(
            f'<tr class="{"fail" if failed else "clean"}"><td>{n}</td><td>{html.escape(str(step.get("label", "")))}'
            f"</td><td>{_bar(usage)} {shown}</td><td>{html.escape(cell)}</td></tr>"
        )
    return "\n".join(out)


def ladder_html(verdict: Mapping[str, Any]) -> str:
    """The steps and the ladder as one self-contained page (no script, no fetch)."""
    conditions = verdict.get("conditions") or {}
    needs = "".join(
        f"<li><b>{html.escape(name)}</b> {html.escape(str(c.get('state')))}: {html.escape(str(c.get('why')))}</li>"
        for name, c in conditions.items()
    )
    steps = list(verdict.get("steps") or [])
    ladder = [s for s in steps if s.get("step") in ("lower-pressure", "as-run")]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>radixtop confirmation run: {html.escape(str(verdict.get("verdict")))}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 3px 8px; border-bottom: 1px solid #ddd; text-align: left; }}
.bar {{ display: inline-block; height: 10px; background: #7a8; vertical-align: middle; }}
tr.fail .bar {{ background: #c44; }} tr.fail td:last-child {{ color: #a22; }}
</style></head><body>
<h1>Verdict: {html.escape(str(verdict.get("verdict")))}</h1>
<p>{html.escape(str(verdict.get("reason", "")))}</p>
<h2>What the failure needs</h2><ul>{needs}</ul>
<h2>The pressure ladder</h2>
<p>Peak token usage per rung (evictable counted free), lowest load first; red: it failed.</p>
<table><tr><th>#</th><th>rung</th><th>peak token usage</th><th>result</th></tr>
{_rows(ladder)}
</table>
<h2>Every step</h2>
<table><tr><th>#</th><th>step</th><th>peak token usage</th><th>result</th></tr>
{_rows(steps)}
</table>
</body></html>
"""


def add_experiment(bundle: Path, verdict: Mapping[str, Any]) -> list[str]:
    """Add the verdict and its picture to a finished bundle; the paths added."""
    bundle = Path(bundle)
    manifest = json.loads((bundle / MANIFEST).read_text(encoding="utf-8"))
    added = {VERDICT_FILE: json.dumps(verdict, indent=2) + "\n", LADDER_FILE: ladder_html(verdict)}
    (bundle / "experiment").mkdir(exist_ok=True)
    for rel, text in added.items():
        (bundle / rel).write_text(text, encoding="utf-8")
    entries = [e for e in manifest["files"] if e["path"] not in added]
    entries += [{"path": rel, "sha256": _sha256(bundle / rel), "bytes": (bundle / rel).stat().st_size}
                for rel in added]
    manifest["files"] = sorted(entries, key=lambda e: e["path"])
    manifest["experiment"] = {"verdict": verdict.get("verdict"), "files": list(added)}
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    (bundle / SUMS).write_text("".join(f"{e['sha256']}  {e['path']}\n" for e in manifest["files"]),
                               encoding="utf-8")
    if (bundle.parent / f"{bundle.name}.tar.gz").exists():
        _write_archive(bundle, bundle.parent, bundle.name)
    return list(added)
