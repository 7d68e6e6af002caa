"""Helpers shared by the serving tests: one loaded tiny index per run (one
query-model load), and servers run in a thread on a free loopback port."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from functools import lru_cache
from typing import Callable, Iterator

import uvicorn

from ritrag.serving.api import RitragIndex


@lru_cache(maxsize=None)
def loaded_index(index_dir: str) -> RitragIndex:
    index = RitragIndex(index_dir)
    index.embed_query("warm up")
    return index


@contextlib.contextmanager
def serving(app: Callable, **options) -> Iterator[str]:
    """Run the ASGI `app` with uvicorn on 127.0.0.1 (with `uvicorn.Config`
    `options`) and yield its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
