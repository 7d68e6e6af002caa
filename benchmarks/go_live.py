"""A version going live, on the product's own path: one changed page, from
the start of `ritrag update` to a running `ritrag serve --watch_s 1` (or `--watch_s`)
answering from the new version, against a fresh process's cold load of the
same version (what every new version cost while the server derived its
arrays from all segments at each load).

    python -m benchmarks.go_live --pages 10000 [--work /tmp/bench-go-live] [--reuse] [--watch_s 1]
    python -m benchmarks.go_live --synthetic INDEX [--watch_s 1]

The corpus is `ritrag synth --pages N` (plus the edited page) built with
`ritrag build --embedding_model hashing:384`: the default representation
(node documents, anchor documents), what `ritrag build` writes. Reported, in
one run: the build; the update's wall time; publish -> served and update
start -> served through the running server's watcher; a fresh process's
cold load and first GetToC of the new version (wall, anonymous memory); the
reload's cost inside a process that holds the old version (what the watcher
pays), and the ratio of that reload to the cold load.

With `--synthetic`, the index is one benchmarks/synthetic_index.py wrote (the
same representation, at sizes whose Beam build does not fit this machine) and
the change is its `write_synthetic_change`: the version `ritrag update`
publishes for one edited page, written by the benchmark, so the update's own
wall time is not measured; everything from the publish on is the product's.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import httpx

from benchmarks.results import cpu_description, write_section
from benchmarks.serving import start_server
from benchmarks.synthetic_index import write_synthetic_change

COLD_LOAD = r"""
import json, resource, sys, time
start = time.perf_counter()
from ritrag.serving.api import RitragIndex
index = RitragIndex(sys.argv[1])
loaded = time.perf_counter()
index.get_toc("configuration of the server")
answered = time.perf_counter()
anon = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("RssAnon:"))
print(json.dumps({"load_s": loaded - start, "first_toc_s": answered - start, "rss_anon": anon,
                  "nodes": len(index.loaded.node_row),
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

# The watcher's reload, five times beside the same old version (each new one
# released before the next, so each starts from what the old one holds): the median.
RELOAD = r"""
import json, statistics, sys, time
from ritrag.serving.api import RitragIndex
old = RitragIndex(sys.argv[1], sys.argv[2])
old.get_toc("configuration of the server")
times = []
for _ in range(5):
    start = time.perf_counter()
    new = RitragIndex(sys.argv[1], sys.argv[3])
    new.adopt_embedder(old)
    new.get_toc("configuration of the server")
    times.append(time.perf_counter() - start)
    del new
print(json.dumps({"reload_s": statistics.median(times)}))
"""

# Retrieval-only GetToC (the query vector given: no embedding) on one version, in
# process: 200 node titles drawn with a fixed seed, 20 warm-up calls, then p50/p99.
TOC_LATENCY = r"""
import json, random, sys, time
import numpy as np
from ritrag.serving.api import RitragIndex, one_thread_per_query
one_thread_per_query()  # as `ritrag serve` runs
index = RitragIndex(sys.argv[1], sys.argv[2])
titles = index.loaded.nodes["title"]
queries = [titles[r] for r in random.Random(0).sample(range(len(titles)), 200)]
vectors = [index.embed_query(q) for q in queries]
for q, v in zip(queries[:20], vectors):
    index.get_toc(q, query_vector=v)
seconds = []
for q, v in zip(queries, vectors):
    start = time.perf_counter()
    index.get_toc(q, query_vector=v)
    seconds.append(time.perf_counter() - start)
print(json.dumps({"p50_ms": float(np.median(seconds)) * 1000, "p99_ms": float(np.percentile(seconds, 99)) * 1000}))
"""


def ritrag(*args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ritrag.cli", *args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def python(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def edit_one_page(pages: str) -> str:
    """Append a sentence to the first paragraph of the first page in path order."""
    path = min(os.path.join(d, f) for d, _, files in os.walk(pages) for f in files if f.endswith(".html"))
    with open(path, "rb") as fh:
        data = fh.read()
    with open(path, "wb") as fh:
        fh.write(data.replace(b"</p>", b" Revised for the go-live benchmark.</p>", 1))
    return path


def served_version(client: httpx.Client) -> str | None:
    try:
        return client.post("/v1/toc", json={"query": "configuration of the server"}).json().get("version")
    except (httpx.TransportError, ValueError):
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--work", default="/tmp/bench-go-live")
    parser.add_argument("--reuse", action="store_true", help="keep a built index of the same size in --work "
                                                             "(or, with none built, the synthetic pages there)")
    parser.add_argument("--watch_s", type=float, default=1.0, help="the running server's --watch_s")
    parser.add_argument("--label", default="current", help="which code ran (run the script with a baseline "
                                                          "checkout's Python to measure that code)")
    parser.add_argument("--synthetic", metavar="INDEX", help="an index benchmarks/synthetic_index.py wrote, changed "
                                                             "by its write_synthetic_change instead of an update")
    args = parser.parse_args(argv)
    pages, index = os.path.join(args.work, "pages"), args.synthetic or os.path.join(args.work, "index")
    built_s = None
    if not args.synthetic and not (args.reuse and os.path.exists(os.path.join(index, "CURRENT"))):
        if args.reuse and os.path.isdir(pages):
            shutil.rmtree(index, ignore_errors=True)
        else:
            shutil.rmtree(args.work, ignore_errors=True)
            ritrag("synth", "--pages", str(args.pages), "--out", pages)
        built_s = ritrag("build", pages, "--out", index, "--embedding_model", "hashing:384")
    before = open(os.path.join(index, "CURRENT")).read().strip()
    load_before = os.getloadavg()[0]

    server, url, ready_s = start_server(index, "--watch_s", str(args.watch_s))
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert served_version(client) == before
            started = time.time()
            if args.synthetic:
                write_synthetic_change(index)
                update_s = time.time() - started
            else:
                edit_one_page(pages)
                update_s = ritrag("update", pages, "--index", index)
            after = open(os.path.join(index, "CURRENT")).read().strip()
            # CURRENT's replacement is the commit point; the job still prunes and exits after it
            published = os.stat(os.path.join(index, "CURRENT")).st_mtime
            while served_version(client) != after:
                if time.time() - published > 600:
                    raise RuntimeError("the server never served the new version")
                time.sleep(0.05)
            served = time.time()
    finally:
        server.terminate()
        server.wait()
    cold = python(COLD_LOAD, index)
    reload = python(RELOAD, index, before, after)
    latency = {version: python(TOC_LATENCY, index, version) for version in (before, after)}
    manifests = {v: json.load(open(os.path.join(index, "versions", f"{v}.json"))) for v in (before, after)}
    n_segments, update_counts = len(manifests[after]["segments"]), manifests[after]["stats"]["pages"]
    size = cold["nodes"] if args.synthetic else args.pages
    if args.synthetic:
        corpus = (f"- index: `{index}`, written by benchmarks/synthetic_index.py ({size:,} nodes, "
                  f"{manifests[before]['stats']['bm25']['n_chunks']:,} rows of the chunks table, default "
                  f"representation); one node's body changed by its `write_synthetic_change`; {n_segments} segments "
                  f"after the change; load average {load_before:.1f} at the start")
        update = (f"- the change written and published by the benchmark in {update_s:.1f} s (not `ritrag update`: "
                  f"not a product figure)")
    else:
        corpus = (f"- corpus: `ritrag synth --pages {args.pages}`, built with `--embedding_model hashing:384` (default "
                  f"representation){f' in {built_s:.0f} s' if built_s else ''}; one page edited; {n_segments} "
                  f"segments after the update; load average {load_before:.1f} at the start")
        update = (f"- `ritrag update` (one changed page): {update_s:.1f} s wall (CURRENT replaced after "
                  f"{published - started:.1f} s); files unread, their size and mtime unchanged: "
                  f"{update_counts.get('pages_trusted_by_stamp', 0):,} of {update_counts['pages_read']:,}")
    lines = [
        f"## A version going live (benchmarks/go_live.py): {size:,} synthetic pages, one changed, {args.label}",
        "",
        f"Machine: {cpu_description()}. Command: `python -m benchmarks.go_live {shlex.join(argv or sys.argv[1:])}`.",
        "",
        corpus,
        f"- `ritrag serve --watch_s {args.watch_s:g}` ready in {ready_s:.1f} s",
        update,
        f"- CURRENT replaced -> served by the running server: {served - published:.2f} s; "
        f"{'change' if args.synthetic else 'update'} start -> served: {served - started:.1f} s",
        f"- baseline, a fresh process's cold load of {after}: {cold['load_s']:.2f} s to loaded, "
        f"{cold['first_toc_s']:.2f} s to the first GetToC; anonymous memory {cold['rss_anon'] / 2**20:.0f} MiB, "
        f"peak RSS {cold['peak_rss'] / 2**20:.0f} MiB",
        f"- reload of {after} in a process that serves {before} (what the watcher pays; median of 5): "
        f"{reload['reload_s']:.2f} s; "
        f"reload / cold load {reload['reload_s'] / cold['first_toc_s']:.2f}",
        *(f"- GetToC retrieval only (query vector given), {version} (segments: {len(manifests[version]['segments'])}"
          f"), 200 node titles in process: p50 {latency[version]['p50_ms']:.2f} ms, "
          f"p99 {latency[version]['p99_ms']:.2f} ms" for version in (before, after)),
    ]
    write_section("benchmarks/go_live.py", f"{size} pages, watch {args.watch_s:g} s, {args.label}", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
