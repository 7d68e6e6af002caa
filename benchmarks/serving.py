"""Serving latency, memory and a load test, on one index.

    python -m benchmarks.serving INDEX --label NAME [--queries 200] [--load_s 60] [--concurrency 16 64]
        [--workers 1 2] [--cache_dir DIR]

1. Python API in this process: load time and RSS growth; GetToC p50/p99 with the
   query embedded on the call and with the vector given (retrieval alone), the
   embedding alone, and Read of the 5 best hits; JSON vs outline token counts
   (o200k_base) of the same ToCs.
2. `ritrag serve INDEX --workers W` as a subprocess on loopback, for each W of
   `--workers` (more than one: budgets in a throwaway redis-server, as they must
   be): time to ready and RSS per process; then, for each C of `--concurrency`,
   C clients for `--load_s` seconds, each looping GetToC then Read of two hits
   (every request bounded by a timeout); errors, throughput, HTTP p50/p99, the
   server's peak RSS summed over its processes, and each worker count's
   throughput against the first's, in the same run.

Queries are node titles drawn with a fixed seed, so runs are comparable. The
section "serving: NAME" of benchmarks/RESULTS.md is replaced by this run's.
"""
from __future__ import annotations

import argparse
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import psutil

from benchmarks.results import cpu_description, write_section
from ritrag.serving.api import RitragIndex, one_thread_per_query
from ritrag.serving.outline import count_tokens, render_outline, toc_json_text


def percentiles(seconds: list[float]) -> str:
    ms = np.asarray(seconds) * 1000
    return f"p50 {np.percentile(ms, 50):.1f} ms, p99 {np.percentile(ms, 99):.1f} ms"


def hits(toc: dict) -> list[str]:
    found, stack = [], list(toc["trees"])
    while stack:
        node = stack.pop()
        if node["hit"]:
            found.append((node["score"], node["id"]))
        stack.extend(node.get("children", ()))
    return [node_id for _, node_id in sorted(found, reverse=True)]


def sample_queries(index: RitragIndex, count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    titles = index.loaded.nodes["title"]
    picked = [titles[rng.randrange(len(titles))] for _ in range(count * 2)]
    return [t for t in dict.fromkeys(picked) if t.strip()][:count]


def in_process(index_dir: str, count: int, cache_dir: str | None) -> tuple[list[str], list[str]]:
    one_thread_per_query()  # as `ritrag serve` does
    process = psutil.Process()
    rss_before = process.memory_info().rss
    start = time.perf_counter()
    index = RitragIndex(index_dir, cache_dir=cache_dir)
    load_s = time.perf_counter() - start
    rss_loaded = process.memory_info().rss
    index.embed_query("warm up")
    queries = sample_queries(index, count)

    embed, full, bare, read, json_tokens, outline_tokens = [], [], [], [], [], []
    for query in queries:
        t0 = time.perf_counter()
        vector = index.embed_query(query)
        t1 = time.perf_counter()
        index.get_toc(query, query_vector=vector)
        t2 = time.perf_counter()
        toc = index.get_toc(query)
        t3 = time.perf_counter()
        index.read(hits(toc)[:5])
        t4 = time.perf_counter()
        embed.append(t1 - t0)
        bare.append(t2 - t1)
        full.append(t3 - t2)
        read.append(t4 - t3)
        json_tokens.append(count_tokens(toc_json_text(toc)))
        outline_tokens.append(count_tokens(render_outline(toc["trees"])))
    ratio = np.asarray(outline_tokens) / np.asarray(json_tokens)
    lines = [
        f"- Python API load{' (builds the --cache_dir)' if cache_dir else ''}: {load_s:.1f} s, "
        f"RSS +{(rss_loaded - rss_before) / 2**30:.2f} GiB "
        f"({len(index.loaded.node_row):,} nodes, {len(index.loaded.chunk_ids):,} chunks, "
        f"{len(index.loaded.postings):,} postings)",
        f"- GetToC (k=200, n=50), query embedded in the call: {percentiles(full)}",
        f"- GetToC with the query vector given (retrieval only): {percentiles(bare)}",
        f"- query embedding alone: {percentiles(embed)}",
        f"- Read of the 5 best hits: {percentiles(read)}",
        f"- ToC size, o200k_base tokens: JSON median {np.median(json_tokens):.0f}, outline median "
        f"{np.median(outline_tokens):.0f}; outline/JSON median {np.median(ratio):.2f} "
        f"(min {ratio.min():.2f}, max {ratio.max():.2f}) over {len(queries)} queries",
    ]
    return lines, queries


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(index: str, *flags: str, env: dict | None = None) -> tuple[subprocess.Popen, str, float]:
    """A `ritrag serve INDEX` process and its URL, once /readyz says ready; and the seconds that took."""
    port = free_port()
    start = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "ritrag.cli", "serve", index, "--port", str(port), *flags],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=url, timeout=5) as probe:
        while True:
            if server.poll() is not None:
                raise RuntimeError("the server exited while loading")
            try:
                if probe.get("/readyz").status_code == 200:
                    return server, url, time.perf_counter() - start
            except httpx.TransportError:
                pass
            time.sleep(0.1)


def tree_rss(proc: psutil.Process) -> tuple[int, int]:
    """(RSS summed over a server and its worker processes, processes counted)."""
    procs = [proc, *proc.children(recursive=True)]
    return sum(p.memory_info().rss for p in procs if p.is_running()), len(procs)


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds (user + system) of a server and its worker processes so far."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def own_cpu() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def load_test(index_dir: str, queries: list[str], seconds: float, concurrencies: list[int], cache_dir: str | None,
              workers: int) -> tuple[list[str], dict[int, float]]:
    """The lines of one server's load tests and its throughput (requests/s) per concurrency."""
    flags = [*(["--cache_dir", cache_dir] if cache_dir else []), "--workers", str(workers), "--watch_s", "0"]
    redis = None
    if workers > 1:
        redis = subprocess.Popen([shutil.which("redis-server"), "--port", str(port := free_port()), "--bind",
                                  "127.0.0.1", "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        flags += ["--budget_store", f"redis://127.0.0.1:{port}/0"]
    server, url, ready_s = start_server(index_dir, *flags)
    try:
        proc = psutil.Process(server.pid)
        time.sleep(1.0)  # every worker up: /readyz answered from one
        rss_ready, processes = tree_rss(proc)
        lines = [f"- `ritrag serve --workers {workers}`{' --cache_dir (mapping the cache)' if cache_dir else ''}: "
                 f"ready (index loaded, query model warm) in {ready_s:.1f} s; {processes} processes, RSS "
                 f"{rss_ready / 2**30:.2f} GiB together ({rss_ready / max(processes - (workers > 1), 1) / 2**30:.2f} "
                 f"GiB per serving process)"]
        throughput = {}
        for concurrency in concurrencies:
            line, throughput[concurrency] = _load(url, proc, queries, seconds, concurrency, rss_ready)
            lines.append(line)
        return lines, throughput
    finally:
        server.terminate()
        server.wait(timeout=30)
        if redis is not None:
            redis.terminate()
            redis.wait(timeout=10)


def _load(url: str, proc: psutil.Process, queries: list[str], seconds: float, concurrency: int, rss_ready: int
          ) -> tuple[str, float]:
    """One load test: its line and its throughput (requests/s)."""
    latencies: dict[str, list[float]] = {"toc": [], "read": []}
    errors: list[str] = []
    peak = [rss_ready]
    stop = time.perf_counter() + seconds
    lock = threading.Lock()

    def client(worker: int) -> None:
        rng = random.Random(worker)
        with httpx.Client(base_url=url, timeout=30) as http:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                toc = http.post("/v1/toc", json={"query": rng.choice(queries)})
                t1 = time.perf_counter()
                if toc.status_code != 200:
                    with lock:
                        errors.append(f"toc {toc.status_code}")
                    continue
                ids = hits(toc.json())[:2] or [toc.json()["trees"][0]["id"]]
                read = http.post("/v1/read", json={"node_ids": ids})
                t2 = time.perf_counter()
                with lock:
                    latencies["toc"].append(t1 - t0)
                    if read.status_code == 200:
                        latencies["read"].append(t2 - t1)
                    else:
                        errors.append(f"read {read.status_code}")

    def sample_rss() -> None:
        while time.perf_counter() < stop:
            peak[0] = max(peak[0], tree_rss(proc)[0])
            time.sleep(0.5)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    threads.append(threading.Thread(target=sample_rss))
    # CPU time of the server and of this load generator over the test: on a
    # machine whose cores both share, what the generator takes bounds what
    # more workers can add.
    server_cpu, client_cpu = tree_cpu(proc), own_cpu()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server_cpu, client_cpu = tree_cpu(proc) - server_cpu, own_cpu() - client_cpu
    requests = len(latencies["toc"]) + len(latencies["read"]) + len(errors)
    return (f"  - {concurrency} concurrent clients for {seconds:.0f} s on loopback: {requests} requests "
            f"({requests / seconds:.1f}/s), {len(errors)} errors{': ' + ', '.join(errors[:5]) if errors else ''}; "
            f"HTTP GetToC {percentiles(latencies['toc'])}; HTTP Read of 2 nodes "
            f"{percentiles(latencies['read'])}; peak RSS {peak[0] / 2**30:.2f} GiB; CPU per request: server "
            f"{1e3 * server_cpu / max(requests, 1):.1f} ms, load generator {1e3 * client_cpu / max(requests, 1):.1f} ms "
            f"(cores busy: server {server_cpu / seconds:.2f}, load generator {client_cpu / seconds:.2f})",
            requests / seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("index")
    parser.add_argument("--label", required=True, help="names this run's section of RESULTS.md")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--load_s", type=float, default=60)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16], help="client counts, each a load test")
    parser.add_argument("--workers", type=int, nargs="+", default=[1], help="server processes, each a server")
    parser.add_argument("--cache_dir", help="the in-process load builds it, the server then maps it")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    load_before = os.getloadavg()[0]
    api_lines, queries = in_process(args.index, args.queries, args.cache_dir)
    http_lines, throughput = [], {}
    for workers in args.workers:
        lines, throughput[workers] = load_test(args.index, queries, args.load_s, args.concurrency, args.cache_dir,
                                               workers)
        http_lines += lines
    first = args.workers[0]
    http_lines += [f"- throughput with {w} workers / {first}: " + ", ".join(
        f"{throughput[w][c] / throughput[first][c]:.2f}x at {c} clients" for c in args.concurrency)
        for w in args.workers[1:]]
    command = "python -m benchmarks.serving " + shlex.join(argv or sys.argv[1:])
    # Other jobs may share the machine; their load inflates every figure.
    machine = f"Machine: {cpu_description()}; load average {load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    body = "\n".join([f"## Serving: {args.label}", "", f"`{command}`", "", machine, "", *api_lines, *http_lines])
    print(body)
    write_section("serving", args.label, body)


if __name__ == "__main__":
    main()
