"""A bundle of a log and a live server seeded with every secret shape radixtop has been shown to
leak keeps none of them: not in any file, not in a file name, SHA256SUMS, the manifest or the
archive's listing. A real stand-in server process on loopback, a real log file."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from hardening_helpers import start_standin
from incident_helpers import write_lines

from radixtop.incident.bundle.bundle import take_bundle, verify_bundle
from radixtop.incident.common.redact import REDACTED, Redactor

SIGNATURE = (
    "[2026-12-02 14:00:03 TP0] sglang.srt.mem_cache.radix_cache.RadixCacheError: "
    "Failed to lock memory page during dynamic prefix eviction"
)
FILE_TOKEN = "ghp_PlantedFileNameToken0123456789abcdef"  # a log named after a token

# One value per shape; each must be absent from the bundle.
TOKENS = {
    "glpat": "glpat-PlantedGitLab0123456789ab",
    "xoxb": "xoxb-1234567890-1234567890123-PlantedSlackBot0123456789",
    "xoxp": "xoxp-1234567890-1234567890-1234567890-plantedslackuser0123456789abcdef",
    "aiza": "AIzaSyPlantedGoogleKey0123456789abcdef",
    "npm": "npm_PlantedNpmToken0123456789abcdefABCD",
    "slack_webhook": "https://hooks.slack.com/services/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45",
    "hf": "hf_PlantedHuggingFace0123456789ab",
    "sk": "sk-PlantedOpenAiKey0123456789abcdef",
    "ghp": "ghp_PlantedInlineGithub0123456789abcdefgh",
    "github_pat": "github_pat_PlantedFineGrained0123456789_abcdef",
    "akia": "AKIAPLANTED012345678",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJwbGFudGVkIjoiand0In0.PlantedJwtSignature0123456789",
}
PASSWORDS = {  # the secret part, and the line that carries it
    "r3disPlantedPw": "connecting to redis://:r3disPlantedPw@cache.internal:6379/0",
    "mysqlPlantedPw77": "env MYSQL_PWD=mysqlPlantedPw77 mysql -u root",
    "hunter2": "the operator typed password hunter2 at the prompt",
    "plantedBearer98765": "curl -H 'Authorization: Bearer plantedBearer98765' http://127.0.0.1/generate",
    "cGxhbnRlZEJhc2ljOnB3": "Authorization: Basic cGxhbnRlZEJhc2ljOnB3",
    "opaqueApiKey777": "launch: python -m sglang.launch_server --api-key opaqueApiKey777 --port 30000",
}


def _body(tag: str, n: int) -> list[str]:
    """Base64 key-body lines, 64 characters each, each with a unique tag."""
    return [(f"MIIEpQIBAAKCAQEA{tag}{i:03d}" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefgh")[:64] for i in range(n)]


RSA_EDGE = _body("PlantedRsaEdge", 40)  # starts before the 100-line window
SSH_WHOLE = _body("PlantedSshWhole", 6)  # wholly inside the window
PGP = _body("PlantedPgpBody", 6)
EC_TAIL = _body("PlantedEcTail", 40)  # ends after the window
KEY_LINES = RSA_EDGE + SSH_WHOLE + PGP + EC_TAIL


def _log_lines() -> list[str]:
    lines = [f"[2026-12-02 14:00:01 TP0] filler line {i}" for i in range(10)]
    lines += ["-----BEGIN RSA PRIVATE KEY-----", *RSA_EDGE, "-----END RSA PRIVATE KEY-----"]
    lines += [f"[2026-12-02 14:00:01 TP0] quiet line {i}" for i in range(20)]
    lines += ["-----BEGIN OPENSSH PRIVATE KEY-----", *SSH_WHOLE, "-----END OPENSSH PRIVATE KEY-----"]
    lines += ["-----BEGIN PGP PRIVATE KEY BLOCK-----", "Version: GnuPG v2", "", *PGP, "=AbCd",
              "-----END PGP PRIVATE KEY BLOCK-----"]
    lines += [f"[2026-12-02 14:00:02] token {v}" for v in TOKENS.values()]
    lines += [f"[2026-12-02 14:00:02] {line}" for line in PASSWORDS.values()]
    while len(lines) < 130:
        lines.append(f"[2026-12-02 14:00:02 TP0] busy line {len(lines)}")
    lines.append(SIGNATURE)
    lines += [f"[2026-12-02 14:00:04 TP0] after line {i}" for i in range(30)]
    lines += ["-----BEGIN EC PRIVATE KEY-----", *EC_TAIL, "-----END EC PRIVATE KEY-----"]
    return lines


def _secrets() -> list[str]:
    return [FILE_TOKEN, *TOKENS.values(), *PASSWORDS, *KEY_LINES]


def _leaks(out: Path) -> list[str]:
    found = []
    for path in sorted(out.rglob("*")):
        rel = str(path.relative_to(out))
        found += [f"file name {rel}: {s}" for s in _secrets() if s in rel]
        if not path.is_file():
            continue
        data = path.read_bytes()
        found += [f"{rel}: {s}" for s in _secrets() if s.encode() in data]
        if path.name.endswith(".tar.gz"):
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                for member in tar.getmembers():
                    found += [f"tar member name {member.name}: {s}" for s in _secrets() if s in member.name]
                    handle = tar.extractfile(member)
                    content = handle.read() if handle else b""
                    found += [f"{rel}:{member.name}: {s}" for s in _secrets() if s.encode() in content]
    return found


def test_a_bundle_of_a_log_and_a_server_seeded_with_every_secret_shape_keeps_none(tmp_path: Path) -> None:
    log = tmp_path / "logs" / f"{FILE_TOKEN}.log"
    log.parent.mkdir()
    lines = _log_lines()
    assert lines.index(SIGNATURE) - 100 > lines.index("-----BEGIN RSA PRIVATE KEY-----")
    assert lines.index(SIGNATURE) - 100 < lines.index("-----END RSA PRIVATE KEY-----")  # the window starts inside
    write_lines(log, lines)
    seeded = {**TOKENS, **{f"line{i}": line for i, line in enumerate(PASSWORDS.values())}}
    seeded["key"] = "\n".join(["-----BEGIN RSA PRIVATE KEY-----", *RSA_EDGE, "-----END RSA PRIVATE KEY-----"])
    secrets_file = tmp_path / "seed.json"
    secrets_file.write_text(json.dumps(seeded))
    server = start_standin(
        tmp_path / "srv", "--secrets", str(secrets_file), "--redis-url", "redis://:r3disPlantedPw@cache:6379",
        "--api-key", "opaqueApiKey777", f"--note={TOKENS['xoxb']}",
        env={"MYSQL_PWD": "mysqlPlantedPw77", "HF_TOKEN": TOKENS["hf"], "SLACK_HOOK": TOKENS["slack_webhook"]},
    )
    try:
        result = take_bundle(
            tmp_path / "out", url=server.url, logs=[str(log)], reason="secrets", torch_env_timeout_s=30
        )
    finally:
        server.stop()
    root = result.path
    assert verify_bundle(root) == [] and verify_bundle(result.archive) == []
    assert _leaks(tmp_path / "out") == []
    # what is not secret is kept: the evidence, the server's state, the file (renamed)
    evidence = next(root.glob("evidence/*radix-page-lock-eviction.log")).read_text()
    assert SIGNATURE in evidence and "busy line 129" in evidence and "after line 29" in evidence
    assert REDACTED in evidence
    assert json.loads((root / "server/server_info.json").read_text())["version"] == "0.5-standin"
    assert json.loads((root / "procs/processes.json").read_text())["root_pid"] == server.pid
    assert any(p.name.endswith(".tail.log") and REDACTED in p.name for p in (root / "logs").iterdir())
    findings = json.loads((root / "findings.json").read_text())
    before = findings["findings"][0]["context_before"]
    assert len(before) >= 100 and before[-1].endswith("busy line 129")  # a line for a line


def test_redacted_windows_keep_their_length_and_cut_key_blocks_go_whole() -> None:
    r = Redactor()
    window = RSA_EDGE[-5:] + ["-----END RSA PRIVATE KEY-----", "kept line"]
    assert r.lines(window) == [REDACTED] * 6 + ["kept line"]
    assert r.text("\n".join(window)) == f"{REDACTED}\nkept line"
    tail = ["kept line", "-----BEGIN PGP PRIVATE KEY BLOCK-----", "Version: x", "", *PGP[:2]]
    assert r.lines(tail) == ["kept line", *[REDACTED] * 5]
    assert r.lines(PGP[1:3]) == [REDACTED, REDACTED]  # neither edge in view
    digest = "0123456789abcdef" * 4  # a manifest's SHA-256 is not a key body
    assert r.text(digest) == digest and r.json({"sha256": digest}) == {"sha256": digest}
    for env_line in ("PWD=/srv/dir OLDPWD=/tmp", "password authentication failed for user x"):
        assert r.text(env_line) == env_line
