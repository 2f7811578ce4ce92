"""A small stand-in for an LLM server on 127.0.0.1, standard library only (so that any copy of
the interpreter runs it): the hardening tests start it as a real process.

    python standin_server.py --ready FILE [--mode secrets|slow|deep] [--drip S] [anything else]

``secrets``: /server_info and /metrics answer with every secret shape of SECRET_SHAPES (passed as
a JSON file with --secrets). ``slow``: every answer is sent one byte every --drip seconds (at most
120 s). ``deep``: /server_info is a JSON document 900 levels deep beside ordinary fields.
``--list-instrument URL`` (repeatable): /server_info's radixtop_instrument list.
``generate``: POST /generate answers as SGLang does (the text names the prompt: the first 12 hex
digits of the SHA-1 of its input_ids as JSON), each request is recorded as a JSON line in
--record FILE (its headers, that prompt name, its extra_key, the client's port), the first
--drop N requests are read and their connection closed with no answer (a server closing a
keep-alive connection as a call arrives), and --close-after-answer closes every
connection after its answer without saying so, and --answer-after S holds each answer S seconds
(the record's ``in_flight``: generate requests being served as this one arrived, itself included).
--tls CERT KEY serves HTTPS. --flush-bytes N: POST /flush_cache answers 200 with N bytes and no
Content-Length (read until the connection closes). --info FILE: /server_info answers FILE's bytes.
--flush-error-page answers POST /flush_cache 502 with a proxy's HTML error page of many lines (an
escape sequence in it). A POST body over 1 MiB is read to its end and answered 413.
Arguments it does not know are ignored, so a test can put secrets in its argv.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DRIP_LIMIT_S = 120.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready", required=True)
    parser.add_argument("--mode", default="secrets")
    parser.add_argument("--drip", type=float, default=2.0)
    parser.add_argument("--secrets", default=None)
    parser.add_argument("--list-instrument", action="append", default=[], help="a URL for radixtop_instrument")
    parser.add_argument("--record", default=None)
    parser.add_argument("--drop", type=int, default=0)
    parser.add_argument("--close-after-answer", action="store_true")
    parser.add_argument("--answer-after", type=float, default=0.0)
    parser.add_argument("--tls", nargs=2, default=None, metavar=("CERT", "KEY"))
    parser.add_argument("--flush-bytes", type=int, default=0)
    parser.add_argument("--info", default=None)
    parser.add_argument("--flush-error-page", action="store_true")
    args, _ = parser.parse_known_args()
    secrets = json.load(open(args.secrets)) if args.secrets else {}
    lock = threading.Lock()
    seen = [0]  # generate requests so far
    serving = [0]  # generate requests being served now

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?")[0]
            if args.mode == "slow":
                return self._drip(b'{"version": "slow"}')
            if path == "/health":
                return self._send(200, b"")
            if path == "/server_info":
                if args.info:
                    with open(args.info, "rb") as fh:
                        return self._send(200, fh.read())
                if args.mode == "deep":
                    deep = "[" * 900 + "]" * 900
                    listed = json.dumps(args.list_instrument)
                    body = (f'{{"version": "0.5-standin", "max_total_num_tokens": 4096, "deep": {deep}, '
                            f'"radixtop_instrument": {listed}}}').encode()
                    return self._send(200, body)
                doc = {"version": "0.5-standin", "notes": list(secrets.values()), **secrets}
                if args.list_instrument:
                    doc["radixtop_instrument"] = args.list_instrument
                return self._send(200, json.dumps(doc).encode())
            if path == "/metrics":
                text = "".join(f"# {v}\n" for v in secrets.values()) + "sglang:num_running_reqs 0\n"
                return self._send(200, text.encode())
            return self._send(404, b"not found")

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, 1 << 20))
            rest = length - len(body)
            while rest > 0:  # read and drop the rest: a client streaming a huge body is never stalled
                got = len(self.rfile.read(min(rest, 1 << 20)))
                if not got:
                    return
                rest -= got
            if length > 1 << 20:
                return self._send(413, b"too large")
            if args.flush_error_page and self.path == "/flush_cache":
                page = ("<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n"
                        "<h1>Bad Gateway</h1>\n\x1b]2;TITLE\x07<p>" + "upstream said no. " * 40
                        + "</p>\n</body></html>\n")
                return self._send(502, page.encode())
            if args.mode == "generate" and self.path == "/generate":
                return self._generate(body)
            if self.path == "/flush_cache" and args.flush_bytes:
                return self._flood(args.flush_bytes)
            if args.mode == "slow":
                return self._drip(b'{"text": "slow", "meta_info": {}}')
            return self._send(404, b"not found")

        def _generate(self, body: bytes) -> None:
            doc = json.loads(body)
            prompt = hashlib.sha1(json.dumps(doc.get("input_ids")).encode()).hexdigest()[:12]
            with lock:
                seen[0] += 1
                serving[0] += 1
                dropped = seen[0] <= args.drop
                if args.record:
                    with open(args.record, "a") as fh:
                        fh.write(json.dumps({"headers": dict(self.headers.items()), "prompt": prompt,
                                             "dropped": dropped,
                                             "port": self.client_address[1], "in_flight": serving[0],
                                             "extra_key": doc.get("extra_key"),
                                             "at": time.time()}) + "\n")
            try:
                if dropped:
                    self.close_connection = True
                    return
                time.sleep(args.answer_after)
                answer = {"text": f"answer to {prompt}", "output_ids": [1, 2], "meta_info": {"cached_tokens": 0}}
                self._send(200, json.dumps(answer).encode())
            finally:
                with lock:
                    serving[0] -= 1
            if args.close_after_answer:
                self.close_connection = True

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _flood(self, size: int) -> None:
            self.close_connection = True
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
            block = b"x" * (1 << 20)
            try:
                for _ in range(size >> 20):
                    self.wfile.write(block)
            except OSError:
                return

        def _drip(self, body: bytes) -> None:
            raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            end = time.monotonic() + DRIP_LIMIT_S
            try:
                for i in range(len(raw)):
                    if time.monotonic() > end:
                        return
                    self.wfile.write(raw[i : i + 1])
                    self.wfile.flush()
                    time.sleep(args.drip)
            except OSError:
                return

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def finish_request(self, request, client_address) -> None:  # noqa: ANN001 - socketserver's
            if args.tls:  # the handshake on the connection's own thread, as an asynchronous server does it
                import ssl

                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(*args.tls)
                try:
                    request = context.wrap_socket(request, server_side=True)
                except (OSError, ssl.SSLError):
                    return
            super().finish_request(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    with open(args.ready + ".tmp", "w") as fh:
        fh.write(str(server.server_address[1]))
    os.replace(args.ready + ".tmp", args.ready)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
