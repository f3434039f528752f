"""A stand-in server for the load harness's tests: a stdlib HTTP server thread on 127.0.0.1
that answers as SGLang's /generate and /flush_cache and vLLM's /v1/completions and
/reset_prefix_cache do (the fields `benchmarks/load.py` reads), holds each request for
`delay` seconds, and counts what it saw: the requests in flight at once, when each arrived,
every body. A prompt "fail" is answered 500."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    def __init__(self, delay: float = 0.02, verify_steps: int = 0, refuse_flushes: int = 0):
        self.delay, self.verify_steps, self.refuse_flushes = delay, verify_steps, refuse_flushes
        self.lock = threading.Lock()
        self.live = self.peak = 0
        self.arrivals: list[float] = []       # time.time() of each generation request
        self.bodies: list[tuple[str, dict]] = []
        self.flushes: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):   # quiet
                pass

            def do_POST(self):
                size = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(size) or b"{}")
                status, reply = server.answer(self.path, body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)

    def answer(self, path: str, body: dict) -> tuple[int, dict]:
        if path in ("/flush_cache", "/reset_prefix_cache"):
            self.flushes.append(path)
            if self.refuse_flushes:
                self.refuse_flushes -= 1
                return 400, {"error": "Flush cache failed."}
            return 200, {}
        if path not in ("/generate", "/v1/completions"):
            return 404, {"error": path}
        with self.lock:
            self.arrivals.append(time.time())
            self.bodies.append((path, body))
            self.live += 1
            self.peak = max(self.peak, self.live)
        try:
            time.sleep(self.delay)
            if path == "/generate":
                return self.sglang(body)
            return self.vllm(body)
        finally:
            with self.lock:
                self.live -= 1

    @staticmethod
    def _prompt(prompt) -> list[int]:
        return [ord(c) for c in prompt] if isinstance(prompt, str) else list(prompt)

    def sglang(self, body: dict) -> tuple[int, dict]:
        prompt = body.get("text", body.get("input_ids"))
        if prompt == "fail":
            return 500, {"error": "the fake server fails this one"}
        ids = self._prompt(prompt)
        n = body["sampling_params"]["max_new_tokens"]
        out = [(ids[-1] + k) % 500 for k in range(1, n + 1)]
        return 200, {"text": "".join(chr(97 + t % 26) for t in out), "output_ids": out,
                     "meta_info": {"prompt_tokens": len(ids), "completion_tokens": n,
                                   "spec_verify_ct": self.verify_steps, "e2e_latency": self.delay}}

    def vllm(self, body: dict) -> tuple[int, dict]:
        if body["prompt"] == "fail":
            return 500, {"error": "the fake server fails this one"}
        ids = self._prompt(body["prompt"])
        n = body["max_tokens"]
        out = [(ids[-1] + k) % 500 for k in range(1, n + 1)]
        return 200, {"choices": [{"text": "".join(chr(97 + t % 26) for t in out), "token_ids": out}],
                     "usage": {"prompt_tokens": len(ids), "completion_tokens": n}}
