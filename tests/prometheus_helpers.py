"""A real Prometheus on loopback for the fleet tests: Debian's `prometheus` with a generated config
(a 1 s scrape of the targets given, each group labelled with its node), a storage folder in the
test's tmp_path, listening on 127.0.0.1 only. .ci/run installs the package; where it is missing the
tests skip and say why (with RADIXTOP_REQUIRE_PROMETHEUS=1 they fail instead).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from sshd_helpers import free_port

PROMETHEUS = "prometheus"


# Loopback only: an HTTP_PROXY in the environment must not take these requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def require_prometheus() -> str:
    """The prometheus binary, or a skip (a failure under RADIXTOP_REQUIRE_PROMETHEUS=1) saying why."""
    path = shutil.which(PROMETHEUS)
    if path is None:
        why = "prometheus is not installed (apt-get install --no-install-recommends prometheus); .ci/run installs it"
        if os.environ.get("RADIXTOP_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"RADIXTOP_REQUIRE_PROMETHEUS=1 but {why}")
        pytest.skip(why)
    return path


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen
    log: Path

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)


def scrape_config(nodes: dict[str, list[str]], interval: str = "1s") -> str:
    """A prometheus.yml (JSON is YAML) scraping each node's host:port targets, labelled node=NAME."""
    return json.dumps({
        "global": {"scrape_interval": interval, "scrape_timeout": "900ms", "evaluation_interval": "10s"},
        "scrape_configs": [{
            "job_name": "radixtop",
            "static_configs": [{"targets": targets, "labels": {"node": node}} for node, targets in nodes.items()],
        }],
    }, indent=1)


def start_prometheus(workdir: Path, nodes: dict[str, list[str]], timeout_s: float = 30.0) -> Prometheus:
    binary = require_prometheus()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(scrape_config(nodes))
    port = free_port("127.0.0.1")
    log = workdir / "prometheus.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=workdir,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited ({proc.returncode}): {log.read_text()[-800:]}")
        try:
            with _OPENER.open(f"{server.url}/-/ready", timeout=1) as answer:
                if answer.status == 200:
                    return server
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"prometheus was not ready in {timeout_s} s: {log.read_text()[-800:]}")
        time.sleep(0.1)


def query(url: str, promql: str) -> list[dict]:
    """An instant query's result, straight from the API (what the test expects Prometheus to hold)."""
    from urllib.parse import urlencode

    with _OPENER.open(f"{url}/api/v1/query?{urlencode({'query': promql})}", timeout=5) as answer:
        return json.loads(answer.read())["data"]["result"]
