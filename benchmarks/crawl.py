"""Crawl throughput on a local copy of a documentation corpus served over HTTP.

    python -m benchmarks.crawl --corpus /work/corpus --scratch /work/scratch/crawl-bench [--changed 0.01]

A threaded HTTP/1.1 server (its own process, so its CPU is not the crawler's)
serves the corpus folder read-only on 127.0.0.1 with Last-Modified and 304 on
If-Modified-Since, a /sitemap.xml listing every HTML file, no robots.txt (404:
allow all) and no directory listings. Each crawl runs in its own process
(`ritrag.pipelines.crawl`, in-process FnApiRunner) seeded with the server's root, and
reports its wall time, its process CPU time (user + system), its peak RSS and
the WARC bytes written:

  1. 2 per host: --per_host_concurrency 2 --per_host_delay_s 0 (a fresh crawl)
  2. re-crawl of (1) after --changed of the pages (every 1/changed-th page in path
     order, copied into an overlay folder the server prefers, with bytes appended:
     the corpus itself is never written)
  3. politeness off: --per_host_concurrency 16 --per_host_delay_s 0 (a fresh crawl,
     of the corpus with the overlay of (2))

The machine may be shared: CPU seconds per page are the robust figure; the load
average before and after each run is reported next to the wall times.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import urllib.parse
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

from benchmarks.results import cpu_description, write_section

POLITE = ["--per_host_concurrency", "2", "--per_host_delay_s", "0"]
IMPOLITE = ["--per_host_concurrency", "16", "--per_host_delay_s", "0"]


def html_paths(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root)
                  for f in files if f.endswith(".html"))


class CorpusHandler(SimpleHTTPRequestHandler):
    """Files of `root` (an `overlay` copy first), /sitemap.xml, no listings."""

    protocol_version = "HTTP/1.1"

    def __init__(self, *args, root: str, overlay: str, sitemap: bytes, **kwargs):
        self._root, self._overlay, self._sitemap = root, overlay, sitemap
        super().__init__(*args, directory=root, **kwargs)

    def log_message(self, *args):
        pass

    def translate_path(self, path: str) -> str:
        served = super().translate_path(path)
        if self._overlay:
            candidate = os.path.join(self._overlay, os.path.relpath(served, self._root))
            if os.path.isfile(candidate):
                return candidate
        return served

    def list_directory(self, path):
        self.send_error(404, "no listing")
        return None

    def do_GET(self):
        if self.path == "/sitemap.xml":
            self.send_response(200)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(self._sitemap)))
            self.end_headers()
            self.wfile.write(self._sitemap)
            return
        super().do_GET()


def serve(root: str, overlay: str, port_file: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a, **k: None)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    locs = "".join(f"<url><loc>{base}{urllib.parse.quote(p)}</loc></url>" for p in html_paths(root))
    sitemap = ('<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
               f"{locs}</urlset>").encode()
    server.RequestHandlerClass = functools.partial(CorpusHandler, root=os.path.abspath(root),
                                                   overlay=os.path.abspath(overlay) if overlay else "",
                                                   sitemap=sitemap)
    with open(port_file + ".tmp", "w") as fh:
        fh.write(base)
    os.replace(port_file + ".tmp", port_file)
    server.serve_forever()


class Server:
    def __init__(self, root: str, overlay: str, scratch: str):
        self._port_file = os.path.join(scratch, "server.url")
        if os.path.exists(self._port_file):
            os.unlink(self._port_file)
        self._proc = subprocess.Popen([sys.executable, "-m", "benchmarks.crawl", "--serve", root,
                                       "--overlay", overlay, "--port_file", self._port_file])
        while not os.path.exists(self._port_file):
            if self._proc.poll() is not None:
                raise RuntimeError("the corpus server did not start")
            time.sleep(0.2)
        with open(self._port_file) as fh:
            self.base = fh.read()

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait()


def crawl_once(argv: list[str], report: str) -> None:
    """(In a process of its own) one crawl; its figures to `report` as JSON."""
    from ritrag.pipelines import crawl

    started = time.time()
    counts = crawl.run(argv)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(report, "w") as fh:
        json.dump({"wall_s": time.time() - started, "cpu_s": usage.ru_utime + usage.ru_stime,
                   "peak_rss_mib": usage.ru_maxrss / 1024, "counts": counts}, fh)


def measured_crawl(base: str, out: str, flags: list[str], scratch: str) -> dict:
    report = os.path.join(scratch, "run.json")
    load_before = os.getloadavg()[0]
    warc_before = dir_bytes(os.path.join(out, "warc"))
    subprocess.run([sys.executable, "-m", "benchmarks.crawl", "--crawl_once", report, "--",
                    "--seed", base, "--out", out, "--timeout_s", "60", "--warc_shards", "4", *flags], check=True)
    with open(report) as fh:
        figures = json.load(fh)
    figures["load_before"], figures["load_after"] = load_before, os.getloadavg()[0]
    figures["warc_bytes_written"] = dir_bytes(os.path.join(out, "warc")) - warc_before
    figures["pages"] = sum(n for k, n in figures["counts"].items() if k.startswith("page_"))
    return figures


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def make_overlay(corpus: str, overlay: str, fraction: float) -> int:
    shutil.rmtree(overlay, ignore_errors=True)
    paths = html_paths(corpus)[::max(1, round(1 / fraction))]
    for rel in paths:
        os.makedirs(os.path.dirname(os.path.join(overlay, rel)), exist_ok=True)
        with open(os.path.join(corpus, rel), "rb") as src, open(os.path.join(overlay, rel), "wb") as dst:
            dst.write(src.read() + b"\n<!-- changed for the re-crawl benchmark -->\n")
    return len(paths)


def row(name: str, f: dict) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in sorted(f["counts"].items()))
    return (f"| {name} | {f['pages']} | {f['wall_s']:.0f} | {f['pages'] / f['wall_s']:.1f} | {f['cpu_s']:.0f} | "
            f"{1000 * f['cpu_s'] / max(f['pages'], 1):.1f} | {f['peak_rss_mib']:.0f} | "
            f"{f['warc_bytes_written'] / 2 ** 20:.0f} | {f['load_before']:.1f} / {f['load_after']:.1f} | {counts} |")


def report(corpus: str, html: int, corpus_bytes: int, runs: list[tuple[str, dict]], command: str) -> None:
    body = "\n".join([
        "## Crawl: the dev corpus served on 127.0.0.1 (benchmarks/crawl.py)", "",
        f"`{command}` on {cpu_description()}; corpus {corpus}: {html} HTML pages, {corpus_bytes / 2 ** 20:.0f} MiB, "
        "served by a threaded HTTP/1.1 server in its own process (a sitemap of every page, Last-Modified + 304). "
        "Each crawl is one process (in-process FnApiRunner): wall time, process CPU time (user + system), "
        "peak RSS, WARC bytes written (gzip, request + response records). Pages = page rows of the crawl "
        "(fetched + unchanged + other outcomes). The machine is shared: load average (1 min) before / after "
        "each run is shown; CPU ms per page is the robust figure.", "",
        "| run | pages | wall s | pages/s | CPU s | CPU ms/page | peak RSS MiB | WARC MiB | load | rows by outcome |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[row(name, f) for name, f in runs]])
    write_section("crawl", "dev corpus", body)
    print(body)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus")
    parser.add_argument("--scratch")
    parser.add_argument("--changed", type=float, default=0.01, help="fraction of pages changed for the re-crawl")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--overlay", default="", help=argparse.SUPPRESS)
    parser.add_argument("--port_file", help=argparse.SUPPRESS)
    parser.add_argument("--crawl_once", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.serve:
        return serve(args.serve, args.overlay, args.port_file)
    if args.crawl_once:
        return crawl_once([a for a in rest if a != "--"], args.crawl_once)
    command = "python -m benchmarks.crawl " + " ".join(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.scratch, exist_ok=True)
    html = html_paths(args.corpus)
    corpus_bytes = sum(os.path.getsize(os.path.join(args.corpus, p)) for p in html)
    overlay = os.path.join(args.scratch, "overlay")
    shutil.rmtree(overlay, ignore_errors=True)
    runs: list[tuple[str, dict]] = []
    polite_out, impolite_out = os.path.join(args.scratch, "polite"), os.path.join(args.scratch, "impolite")
    for out in (polite_out, impolite_out):
        shutil.rmtree(out, ignore_errors=True)

    server = Server(args.corpus, overlay, args.scratch)  # the overlay is looked up per request
    try:
        runs.append(("fresh, 2 per host", measured_crawl(server.base, polite_out, POLITE, args.scratch)))
        report(args.corpus, len(html), corpus_bytes, runs, command)
        changed = make_overlay(args.corpus, overlay, args.changed)
        runs.append((f"re-crawl, {changed} pages changed, 2 per host",
                     measured_crawl(server.base, polite_out, POLITE, args.scratch)))
        report(args.corpus, len(html), corpus_bytes, runs, command)
        runs.append(("fresh, politeness off (16 per host)",
                     measured_crawl(server.base, impolite_out, IMPOLITE, args.scratch)))
        report(args.corpus, len(html), corpus_bytes, runs, command)
    finally:
        server.stop()

if __name__ == "__main__":
    main()
