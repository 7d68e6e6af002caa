"""A serving replica of a fleet: cold start from an object store, and the cost
of the shared (Redis) budget store.

    python -m benchmarks.fleet INDEX --label NAME --scratch DIR [--load_s 30] [--concurrency 16]

1. The local index INDEX is published to an S3-compatible server on loopback
   (moto's server mode, in this process), as a build publishes: files, the
   manifest, CURRENT last.
2. `ritrag serve s3://...` starts with an empty --cache_dir: time to ready
   (copied, verified, loaded, query model warm) and the bytes copied, from
   its /metrics; then again over the warm cache (nothing copied, nothing
   re-hashed).
3. Over the warm cache, the same server with `--budget_store memory` and with
   `--budget_store redis://` (a redis-server started here): `--concurrency`
   clients loop GetToC for `--load_s` seconds, each call in an episode (a new
   episode every 3 calls, so every call is charged and none refused); HTTP
   p50/p99 and errors.

The section "fleet: NAME" of benchmarks/RESULTS.md is replaced by this run's.
Loopback has no network latency: the copy figures are a lower bound of a
real store's, and Redis here is on the same host.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx

from benchmarks.results import cpu_description, write_section
from benchmarks.serving import free_port, percentiles, sample_queries, start_server
from ritrag.serving.api import RitragIndex

NOTE = ("The budget store's time per call is wall time inside the server, waits for the GIL behind concurrent "
        "requests included; the cold start also builds the derived postings arrays in --cache_dir, which the "
        "warm start maps. On a shared, loaded machine the GetToC percentiles of the two stores differ by less "
        "than their run-to-run noise.")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def publish(local: Path, fs, root: str) -> int:
    """Upload the index (segments, manifests, CURRENT last); returns its bytes."""
    total = 0
    for top in ("segments", "versions"):
        for path in sorted((local / top).rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                fs.put_file(str(path), f"{root}/{path.relative_to(local).as_posix()}")
                total += path.stat().st_size
    fs.pipe_file(f"{root}/CURRENT", (local / "CURRENT").read_bytes())
    return total


def start_fleet_server(uri: str, env: dict, cache_dir: str, *flags: str) -> tuple[subprocess.Popen, str, float]:
    """A replica serving `uri` from `cache_dir`, no version polling; once ready."""
    return start_server(uri, "--cache_dir", cache_dir, "--watch_s", "0", *flags, env=env)


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    server.wait(timeout=30)


def load(url: str, queries: list[str], seconds: float, concurrency: int) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client(worker: int) -> None:
        rng, calls = random.Random(worker), 0
        with httpx.Client(base_url=url, timeout=30) as http:
            while time.perf_counter() < deadline:
                episode = f"bench-{worker}-{calls // 3}"  # 3 GetToC per episode: all charged, none refused
                calls += 1
                t0 = time.perf_counter()
                response = http.post("/v1/toc", json={"query": rng.choice(queries), "episode_id": episode})
                with lock:
                    if response.status_code == 200:
                        latencies.append(time.perf_counter() - t0)
                    else:
                        errors.append(str(response.status_code))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, errors


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("index")
    parser.add_argument("--label", required=True)
    parser.add_argument("--scratch", required=True, help="cache directories and the Redis directory go here")
    parser.add_argument("--load_s", type=float, default=30)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args(argv)

    import s3fs
    from moto.server import ThreadedMotoServer

    os.environ.update(CREDENTIALS)
    scratch = Path(args.scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    moto_port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
    moto.start()
    endpoint = f"http://127.0.0.1:{moto_port}"
    redis = None
    try:
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="bench", secret="bench")
        fs.mkdir("bench")
        t0 = time.perf_counter()
        size = publish(Path(args.index), fs, "bench/index")
        print(f"published {size / 2**20:.0f} MiB in {time.perf_counter() - t0:.1f} s", flush=True)
        env = {**os.environ, "FSSPEC_S3_ENDPOINT_URL": endpoint}
        uri, cache = "s3://bench/index", str(scratch / "cache")
        lines = [f"## Fleet: {args.label}", "",
                 f"`python -m benchmarks.fleet {args.index} --label '{args.label}' --scratch {args.scratch} "
                 f"--load_s {args.load_s:g} --concurrency {args.concurrency}` on {cpu_description()}; "
                 f"load average before: {os.getloadavg()[0]:.1f}. The store is moto's S3 server on loopback "
                 f"(no network latency: a lower bound of a real store's copy time); Redis is on the same host. "
                 f"{NOTE}", ""]
        for label in ("cold (empty cache)", "warm cache (restart)"):
            server, url, ready_s = start_fleet_server(uri, env, cache)
            copied = metric(url, "ritrag_cache_bytes_copied_total")
            stop(server)
            lines.append(f"- start of `ritrag serve {uri}`, {label}: ready in {ready_s:.1f} s, "
                         f"{copied / 2**20:.0f} MiB copied of {size / 2**20:.0f} MiB")
            print(lines[-1], flush=True)

        queries = sample_queries(RitragIndex(args.index), args.queries)
        redis_port = free_port()
        redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", str(scratch)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        unlimited = ["--max_calls", str(10**9), "--max_toc_calls", str(10**9)]
        for store in ("memory", f"redis://127.0.0.1:{redis_port}/0"):
            server, url, _ = start_fleet_server(uri, env, cache, "--budget_store", store, *unlimited)
            try:
                latencies, errors = load(url, queries, args.load_s, args.concurrency)
                store_ms = ""
                if store != "memory":
                    total = metric(url, 'ritrag_budget_store_seconds_sum')
                    count = metric(url, 'ritrag_budget_store_seconds_count')
                    store_ms = f"; budget store calls: {int(count)}, mean {1000 * total / max(count, 1):.2f} ms"
            finally:
                stop(server)
            lines.append(f"- GetToC in an episode, --budget_store {store.split(':')[0]}, {args.concurrency} clients "
                         f"for {args.load_s:g} s: {len(latencies)} calls, {len(errors)} errors, "
                         f"HTTP {percentiles(latencies)}{store_ms}")
            print(lines[-1], flush=True)
        lines.append(f"- load average after: {os.getloadavg()[0]:.1f}")
    finally:
        if redis is not None:
            redis.terminate()
            redis.wait(timeout=10)
        moto.stop()
    write_section("fleet", args.label, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
