"""A cold `ritrag toc` and `ritrag read`: wall and CPU seconds of a fresh
process, this checkout beside a baseline checkout, in one run.

    python -m benchmarks.cold_start INDEX [--baseline CHECKOUT] [--rounds 5]
           [--query "How do I configure SSL client certificates?"] [--drop_caches]

Each round runs, for each code path in turn (so both see the same machine
load), `toc INDEX QUERY` and `read INDEX NODE` in fresh processes: the CLI's
`main` as the installed command runs it. CPU is the child's user + system time
(`os.wait4`), wall the process's whole life, peak RSS the child's (mapped
pages it touched included). Medians over rounds, and baseline/current ratios.
The node read is the first hit of the query. With `--drop_caches` (root only),
the kernel's page cache is emptied before every timed process, as on a fresh
replica whose disk was never read: each start then reads what it maps from disk.

`--baseline` is another checkout of ritrag (a `git worktree` of an earlier
commit): its `ritrag` package and folders are imported in place of this
checkout's, as in benchmarks/toc_latency.py.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def command_prefix(code: str | None) -> str:
    """Python lines that make `import ritrag` import the checkout at `code`
    (its package folders, as the editable install maps them), or, with None,
    the installed package."""
    if not code:
        return "import sys\n"
    return f"import sys\nsys.path.insert(0, {code!r})\nimport ritrag\nritrag.__path__.append({code!r})\n"


def command(code: str | None, argv: list[str]) -> list[str]:
    return [sys.executable, "-c", command_prefix(code) + f"from ritrag.cli import main; sys.exit(main({argv!r}))"]


def drop_page_cache() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as fh:
        fh.write("3\n")


def timed(argv: list[str]) -> tuple[float, float, str, int]:
    """(wall s, CPU s, stdout, peak RSS bytes) of one process."""
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/")
    out = process.stdout.read().decode()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 3):  # 3: a Read whose ids are unknown (none here)
        raise RuntimeError(f"{argv[-1][-200:]} exited {process.returncode}")
    return time.monotonic() - started, usage.ru_utime + usage.ru_stime, out, usage.ru_maxrss * 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("index")
    parser.add_argument("--baseline", help="another ritrag checkout (a git worktree) measured beside this one")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--query", default="How do I configure SSL client certificates?")
    parser.add_argument("--drop_caches", action="store_true", help="empty the page cache before every timed "
                                                                   "process (root only)")
    args = parser.parse_args(argv)
    paths = ([("baseline", args.baseline)] if args.baseline else []) + [("current", None)]
    toc = ["toc", args.index, args.query, "--n", "8", "--format", "json"]
    node = json.loads(timed(command(None, toc))[2])["trees"][0]["id"]
    read = ["read", args.index, node, "--max_chars", "2000"]
    seconds: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for _ in range(args.rounds):
        for name, code in paths:
            for face, face_argv in (("toc", toc), ("read", read)):
                if args.drop_caches:
                    drop_page_cache()
                wall, cpu, _, rss = timed(command(code, face_argv))
                seconds.setdefault((name, face), []).append((wall, cpu, rss))
    print(f"index {args.index}, {args.rounds} rounds, load average {os.getloadavg()[0]:.2f} at the end"
          f"{', page cache emptied before each process' if args.drop_caches else ''}")
    for (name, face), runs in seconds.items():
        wall, cpu = statistics.median(w for w, _, _ in runs), statistics.median(c for _, c, _ in runs)
        rss = statistics.median(r for _, _, r in runs)
        print(f"  {name:8s} {face:4s}: median wall {wall:.2f} s, CPU {cpu:.2f} s, peak RSS {rss / 2**30:.2f} GiB")
    if args.baseline:
        for face in ("toc", "read"):
            ratio = [statistics.median(x[i] for x in seconds[("baseline", face)]) /
                     statistics.median(x[i] for x in seconds[("current", face)]) for i in (0, 1)]
            print(f"  baseline/current {face}: wall {ratio[0]:.1f}x, CPU {ratio[1]:.1f}x")


if __name__ == "__main__":
    main()
