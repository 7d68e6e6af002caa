"""`ritrag serve --workers N` (issue 28): several processes behind one port,
mapping one cache, with episode budgets that hold across workers; the
in-process budget store, which would split budgets per worker, is refused."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from fleet_fixtures import RedisServer, free_port, needs_redis


def serve(index, *args: str, cwd) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "ritrag.cli", "serve", str(index), "--port", str(port),
                                "--watch_s", "0", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, process.stdout.read()
        try:
            if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                return process, base
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "not ready in 120 s"
        time.sleep(0.3)


def test_more_workers_with_the_in_process_budget_store_are_refused(tiny_hash_index, tmp_path):
    done = subprocess.run([sys.executable, "-m", "ritrag.cli", "serve", str(tiny_hash_index), "--workers", "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    error = json.loads(done.stderr.strip().splitlines()[-1])["error"]
    assert error["reason"] == "invalid_arguments" and "--budget_store redis://" in error["message"]


@needs_redis
@pytest.mark.slow
def test_two_workers_share_one_port_one_cache_and_one_budget(tiny_hash_index, tmp_path):
    redis = RedisServer(tmp_path).start()
    cache = tmp_path / "cache"
    process, base = serve(tiny_hash_index, "--workers", "2", "--budget_store", redis.url, "--cache_dir", str(cache),
                          cwd=tmp_path)
    try:
        workers = psutil.Process(process.pid).children(recursive=True)
        assert len([w for w in workers if "python" in w.name().lower()]) >= 2, workers
        # /readyz answered from one worker; the other may still be loading: wait until
        # 20 new connections in a row (spread over the processes by the kernel) are all ready
        deadline, in_a_row = time.monotonic() + 120, 0
        while in_a_row < 20:
            assert time.monotonic() < deadline, "not every worker became ready in 120 s"
            in_a_row = in_a_row + 1 if httpx.get(f"{base}/readyz", timeout=5).status_code == 200 else 0
        # every worker answers, all the same
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: httpx.post(f"{base}/v1/toc", json={"query": "tls certificates"},
                                                         timeout=60).json()["trees"], range(40)))
        assert all(a == answers[0] for a in answers)
        # one episode's GetToC budget (3) holds whichever worker answers
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda _: httpx.post(f"{base}/v1/toc", timeout=60, json={
                "query": "tls", "episode_id": "shared"}).status_code, range(12)))
        assert sorted(statuses).count(200) == 3 and statuses.count(429) == 9, statuses
        assert any(cache.rglob("*")), "the workers map their arrays from the shared cache"
    finally:
        process.terminate()
        process.wait(timeout=30)
        redis.stop()
