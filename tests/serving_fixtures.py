"""Helpers shared by the serving tests: one loaded tiny index per run (one
query-model load), and servers run in a thread on a free loopback port."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from functools import lru_cache
from typing import Callable, Iterator

import httpx
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


def wait_until_ready(url: str, limit_s: float = 300) -> None:
    """Poll `url`/readyz until the app reports its index loaded: a create_app
    app loads in a background thread after uvicorn starts, and a client that
    asks before (a page's one query on load) gets `not_ready`. The limit is
    only a bound on the loop, far above any load."""
    deadline = time.monotonic() + limit_s
    while httpx.get(f"{url}/readyz", timeout=30).status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} was not ready after {limit_s} s")
        time.sleep(0.05)
