"""A local server speaking the OpenAI chat-completions protocol, scripted
per test and logging every request (the witness of what a stage asked), for
the model stages' tests (tests/test_metadata.py, tests/test_llm_toc.py)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

HANG_S = 8  # the hanging answer comes after this; the deadline of those tests is 2 s


def completion(content: str, body: dict) -> dict:
    prompt_chars = sum(len(m["content"]) for m in body["messages"])
    return {"id": "x", "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(content) // 4}}


class FakeEndpoint:
    """A threaded chat-completions server on 127.0.0.1; `script(body, n)` says
    what to do with the n-th request (0-based): ("ok", content) | ("status",
    code, headers) | ("hang", content) | ("big", n_bytes) | ("raw", bytes)."""

    def __init__(self, script: Callable[[dict, int], tuple]):
        self.script, self.log, self._lock = script, [], threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with endpoint._lock:
                    n = len(endpoint.log)
                    endpoint.log.append(body)
                action = endpoint.script(body, n)
                try:
                    self._answer(action, body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up, as it should
                    pass

            def _answer(self, action, body):
                kind = action[0]
                if kind == "hang":
                    time.sleep(HANG_S)
                if kind in ("ok", "hang"):
                    data = json.dumps(completion(action[1], body)).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                elif kind == "status":
                    data = b'{"error": {"message": "scripted"}}'
                    self.send_response(action[1])
                    for name, value in action[2].items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                elif kind == "raw":
                    self.send_response(200)
                    self.send_header("content-length", str(len(action[1])))
                    self.end_headers()
                    self.wfile.write(action[1])
                elif kind == "big":  # no length: the client learns the size by reading
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.end_headers()
                    piece = b'{"choices": [{"message": {"content": "' + b"x" * 65536
                    for _ in range(action[1] // len(piece) + 1):
                        self.wfile.write(piece)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeEndpoint":
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
