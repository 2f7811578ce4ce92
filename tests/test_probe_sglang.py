"""probes/sglang against the real simulator (with and without --enable-metrics) and a vLLM-like
server on loopback; the metric folding (TP ranks replicate, DP ranks partition)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pane_helpers import Answer, start_sim, stop, stub_server

from radixtop.probes.sglang import ServerProbe, parse_metrics

VLLM_METRICS = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.875
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 4.0
"""


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    base = tmp_path_factory.mktemp("sims")
    with_metrics = start_sim(base / "m", "--tp-size", "2", "--enable-metrics")
    without = start_sim(base / "n")
    yield with_metrics[1], without[1]
    stop(with_metrics[0])
    stop(without[0])


async def test_simulator_with_metrics(sims) -> None:
    probe = ServerProbe(sims[0])
    try:
        sample = await probe.poll()
    finally:
        await probe.aclose()
    assert sample.status.state == "ok"
    info = sample.info
    assert info is not None and info.kind == "sglang" and info.tp_size == 2
    assert info.version.startswith("0.5.23") and len(info.instrument_urls) == 2
    assert "--enable-metrics" in info.launch_command
    m = sample.metrics
    assert m is not None and m.kind == "sglang"
    for key in ("token_usage", "running", "queued", "cache_hit_rate", "evicted_tokens_total", "retracted"):
        assert m.get(key) is not None, key
    assert sample.latency_s is not None


async def test_simulator_without_metrics_says_how_to_get_them(sims) -> None:
    probe = ServerProbe(sims[1])
    try:
        sample = await probe.poll()
    finally:
        await probe.aclose()
    assert sample.status.state == "ok" and sample.metrics is None
    assert "--enable-metrics" in sample.metrics_note


async def test_vllm_is_recognised_and_its_gauges_read() -> None:
    with stub_server() as stub:
        stub.answers["/health"] = Answer(body=b"")
        stub.answers["/version"] = Answer(body=b'{"version": "0.11.0"}')
        stub.answers["/v1/models"] = Answer(body=b'{"object":"list","data":[{"id":"m","owned_by":"vllm"}]}')
        stub.answers["/metrics"] = Answer(body=VLLM_METRICS, content_type="text/plain")
        probe = ServerProbe(stub.url)
        try:
            sample = await probe.poll()
        finally:
            await probe.aclose()
    assert sample.info is not None and sample.info.kind == "vllm" and sample.info.version == "0.11.0"
    m = sample.metrics
    assert m is not None and m.kind == "vllm"
    assert m.get("running") == 3 and m.get("queued") == 5 and m.get("token_usage") == 0.875
    assert m.get("prefix_queries_total") == 1000 and m.get("prefix_hits_total") == 250
    assert m.get("preemptions_total") == 2


async def test_down_then_restarted(tmp_path: Path) -> None:
    proc, url, _ = start_sim(tmp_path / "a")
    probe = ServerProbe(url)
    try:
        assert (await probe.poll()).status.state == "ok"
        stop(proc)
        down = await probe.poll()
        assert down.status.state == "down" and "connection refused" in down.status.message
        assert down.info is not None, "what was known about the server stays"
        assert (await probe.poll()).status.since == down.status.since
    finally:
        await probe.aclose()


async def test_garbage_metrics_and_health_errors_are_statuses() -> None:
    with stub_server() as stub:
        stub.answers["/v1/models"] = Answer(503, b"")
        stub.answers["/server_info"] = Answer(body=b'{"version": "0.5.5", "enable_metrics": true}')
        stub.answers["/metrics"] = Answer(body=b"sglang:token_usage{ this is not prometheus", content_type="text/plain")
        probe = ServerProbe(stub.url)
        try:
            sample = await probe.poll()
        finally:
            await probe.aclose()
    assert sample.status.state == "starting" and "503" in sample.status.message
    assert sample.metrics is None and "does not parse as Prometheus text" in sample.metrics_note


def test_metrics_fold_tp_replicas_and_sum_dp_ranks() -> None:
    text = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",tp_rank="0"} 4.0
sglang:num_running_reqs{dp_rank="0",tp_rank="1"} 4.0
sglang:num_running_reqs{dp_rank="1",tp_rank="0"} 6.0
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",tp_rank="0"} 0.5
sglang:token_usage{dp_rank="1",tp_rank="0"} 0.7
# TYPE sglang:evicted_tokens counter
sglang:evicted_tokens_total{dp_rank="0",tp_rank="0"} 10.0
sglang:evicted_tokens_total{dp_rank="0",tp_rank="1"} 10.0
"""
    m = parse_metrics(text)
    assert m.get("running") == 10.0
    assert m.get("token_usage") == pytest.approx(0.6)
    assert m.get("evicted_tokens_total") == 10.0


def test_http_clients_share_one_ssl_context(monkeypatch) -> None:
    """Building an SSL context loads the CA bundle: 40-90 ms of CPU each time. Every probe client
    (and discovery's, every 30 s) shares one context, made once, which still verifies."""
    import ssl

    from radixtop.probes import http

    made: list[object] = []
    real = ssl.create_default_context

    def counting(*args, **kwargs):
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    monkeypatch.setattr(http, "_SSL_CONTEXT", None)
    for _ in range(3):
        http.make_client()
    assert len(made) == 1
    assert http.ssl_context().verify_mode == ssl.CERT_REQUIRED


async def test_watching_sglang_never_asks_its_generating_health_route() -> None:
    """SGLang's /health runs a generation through the scheduler: the probe tells liveness from
    /v1/models and /metrics, which its HTTP front answers alone (an API key it wants is an answer)."""
    with stub_server() as stub:
        stub.answers["/health"] = Answer(body=b"")
        stub.answers["/v1/models"] = Answer(401, b'{"error": "Unauthorized"}')
        stub.answers["/server_info"] = Answer(body=b'{"version": "0.5.23", "enable_metrics": true}')
        stub.answers["/metrics"] = Answer(body=b"sglang:token_usage 0.5\n", content_type="text/plain")
        probe = ServerProbe(stub.url)
        try:
            states = [(await probe.poll()).status.state for _ in range(4)]
        finally:
            await probe.aclose()
    assert states == ["ok"] * 4
    assert "/health" not in stub.hits and stub.hits["/v1/models"] >= 1 and stub.hits["/metrics"] >= 1


async def test_an_idle_server_is_not_asked_until_its_log_speaks(monkeypatch) -> None:
    """Every request is an access line in the server's log: once it is idle (nothing running or
    queued, its followed log quiet but for access lines) the probe stops asking, access lines of
    its own do not wake it, the server's own line does at once, and a busy server is asked on."""
    import asyncio

    from radixtop.probes import sglang
    from radixtop.probes.status import poll_forever

    monkeypatch.setattr(sglang, "IDLE_AFTER_S", 0.3)
    with stub_server() as stub:
        stub.answers["/v1/models"] = Answer(body=b'{"data": []}')
        stub.answers["/server_info"] = Answer(body=b'{"version": "0.5.23", "enable_metrics": true}')
        idle = b"sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\nsglang:token_usage 0.1\n"
        stub.answers["/metrics"] = Answer(body=idle, content_type="text/plain")
        probe = ServerProbe(stub.url, interval_s=0.05)

        def asked() -> int:
            return sum(stub.hits.values())

        async def follow() -> None:
            async for _ in poll_forever(probe):
                pass

        task = asyncio.create_task(follow())
        try:
            probe.log_spoke(["[2026-12-05 08:00:00] Prefill batch, #new-seq: 1"])
            await asyncio.sleep(1.0)
            assert probe.idle()
            settled = asked()
            await asyncio.sleep(0.8)
            assert asked() == settled, "an idle server was asked"
            probe.log_spoke(['[2026-12-05 08:00:01] INFO:     127.0.0.1:1 - "GET /metrics HTTP/1.1" 200 OK'])
            await asyncio.sleep(0.3)
            assert asked() == settled, "our own access line woke the probe"
            stub.answers["/metrics"] = Answer(body=idle.replace(b"running_reqs 0", b"running_reqs 2"),
                                              content_type="text/plain")
            probe.log_spoke(["[2026-12-05 08:00:02] Prefill batch, #new-seq: 2"])
            await asyncio.sleep(0.15)
            assert asked() > settled, "the server's own line did not wake the probe"
            busy = asked()
            await asyncio.sleep(1.0)  # quiet log, but requests running: asked on
            assert asked() > busy + 5 and not probe.idle()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await probe.aclose()


async def test_without_a_followed_log_the_server_is_asked_at_its_interval() -> None:
    with stub_server() as stub:
        stub.answers["/v1/models"] = Answer(body=b'{"data": []}')
        stub.answers["/metrics"] = Answer(body=b"sglang:num_running_reqs 0\n", content_type="text/plain")
        probe = ServerProbe(stub.url, interval_s=0.05)
        try:
            for _ in range(3):
                await probe.poll()
        finally:
            await probe.aclose()
    assert not probe.idle() and probe.interval_s == 0.05
