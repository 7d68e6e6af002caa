"""The product as a user installs and runs it (issue 24): run by the Python of
a fresh venv holding only the built wheel and the extras a user takes, from an
empty temporary folder, so that nothing of the source tree is importable.

    python .ci/installed_product.py REPO_DIR

Each step runs the installed `ritrag` console script; the last line counts
the steps passed and failed, and the exit status is non-zero when one failed.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from pathlib import Path

REPO = Path(sys.argv[1]).resolve()
BIN = Path(sys.executable).parent
RITRAG = str(BIN / "ritrag")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
STEPS: list[tuple[str, bool]] = []


def ritrag(*args: str, expect: int = 0, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([RITRAG, *args], capture_output=True, text=True, env=ENV, timeout=timeout)
    if done.returncode != expect:
        raise AssertionError(f"ritrag {' '.join(args)} exited {done.returncode} (expected {expect}):\n"
                             f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done


def step(name: str):
    def run(check):
        started = time.monotonic()
        try:
            check()
            STEPS.append((name, True))
            print(f"ok    {name} ({time.monotonic() - started:.1f} s)", flush=True)
        except Exception:  # report every step, then fail the run
            STEPS.append((name, False))
            print(f"FAIL  {name}\n{traceback.format_exc()}", flush=True)
        return check

    return run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.read()


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="ritrag-installed-"))
    os.chdir(work)  # an empty folder: no source tree beside the product
    index = work / "index"

    @step("ritrag is the installed wheel, not the source tree")
    def _():
        import ritrag.serving

        assert "site-packages" in ritrag.serving.__file__, ritrag.serving.__file__

    @step("--help lists the job flags")
    def _():
        text = ritrag("build", "--help").stdout
        for flag in ("--site_depth", "--granularity", "--num_shards", "--embedding_model", "--dense_factory",
                     "--chunk_template", "--path_levels", "--node_docs", "--embed_dtype", "--base_url"):
            assert flag in text, flag

    @step("a mistyped flag exits 2 naming the right one")
    def _():
        done = ritrag("build", str(REPO / "sample" / "pages"), "--out", str(work / "typo"), "--site_dept", "1",
                      expect=2)
        assert "did you mean --site_depth?" in done.stderr

    @step("build the sample (hashing stand-in)")
    def _():
        done = ritrag("build", str(REPO / "sample" / "pages"), "--out", str(index), "--site_depth", "1",
                      "--embedding_model", "hashing:384")
        assert json.loads(done.stdout)["version"] == "v000001"

    @step("a hostile input: nothing indexable refuses in one line")
    def _():
        junk = work / "junk"
        junk.mkdir()
        (junk / "bomb.md").write_text("---\na0: &a0 [x, x]\na1: &a1 [*a0, *a0, *a0, *a0, *a0, *a0, *a0, *a0]\n"
                                      "a2: &a2 [*a1, *a1, *a1, *a1, *a1, *a1, *a1, *a1]\ntitle: *a2\n---\n")
        (junk / "blob.bin").write_bytes(bytes(range(256)))
        done = ritrag("build", str(junk), "--out", str(work / "junk-index"), "--embedding_model", "hashing:384",
                      expect=1, timeout=120)
        assert "Traceback" not in done.stderr and "nothing_to_publish" in done.stderr, done.stderr

    node = {}

    @step("toc and read")
    def _():
        toc = json.loads(ritrag("toc", str(index), "How do I configure SSL client certificates?").stdout)
        node["id"] = toc["trees"][0]["id"]
        outline = ritrag("toc", str(index), "rotate log files", "--format", "outline").stdout
        assert outline.strip()
        read = json.loads(ritrag("read", str(index), node["id"]).stdout)
        assert read["nodes"][0]["id"] == node["id"]

    @step("tools and eval")
    def _():
        assert json.loads(ritrag("tools", "--format", "mcp").stdout)
        ritrag("eval", str(index), str(REPO / "sample" / "questions.jsonl"), "--out", str(work / "eval"))
        assert (work / "eval" / "eval.html").exists()

    @step("serve answers /, /v1/toc and /v1/read")
    def _():
        port = free_port()
        server = subprocess.Popen([RITRAG, "serve", str(index), "--port", str(port)], env=ENV,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if http("GET", f"{base}/readyz")[0] == 200:
                        break
                except OSError:
                    pass
                assert server.poll() is None, server.stdout.read()
                assert time.monotonic() < deadline, "not ready in 120 s"
                time.sleep(0.5)
            status, page = http("GET", f"{base}/")
            assert status == 200 and b"<html" in page
            status, body = http("POST", f"{base}/v1/toc", {"query": "configure SSL client certificates"})
            assert status == 200 and json.loads(body)["trees"]
            status, body = http("POST", f"{base}/v1/read", {"node_ids": [node["id"]]})
            assert status == 200 and json.loads(body)["nodes"][0]["id"] == node["id"]
        finally:
            server.terminate()
            server.wait(timeout=30)

    @step("mcp over stdio lists the tools (the official client)")
    def _():
        import anyio
        from mcp import Client, StdioServerParameters

        params = StdioServerParameters(command=RITRAG, args=["mcp", str(index)], env=ENV, cwd=str(work))

        async def listed() -> set[str]:
            async with Client(params, read_timeout_seconds=120) as client:
                return {t.name for t in (await client.list_tools()).tools}

        assert anyio.run(listed) == {"GetToC", "Read"}

    shutil.rmtree(work, ignore_errors=True)
    failed = sum(1 for _, ok in STEPS if not ok)
    print(f"installed product: {len(STEPS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
