"""What every benchmark shares: the machine line, a process-tree memory sampler,
and writing its own section of benchmarks/RESULTS.md (rerunning replaces it)."""
from __future__ import annotations

import os
import platform
import threading
import time

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def cpu_description() -> str:
    """The CPU (with or without AMX, which decides `--embed_dtype auto`), its CPUs and RAM."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            info = fh.read()
        cpu = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        cpu += " with AMX" if " amx_bf16" in info else " without AMX"
    except (OSError, StopIteration):
        pass
    total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return f"{cpu}, {len(os.sched_getaffinity(0))} CPUs, {total_gib:.0f} GiB RAM"


def write_section(benchmark: str, key: str, body: str) -> None:
    """Replace the section (`benchmark`, `key`) of RESULTS.md, or append it."""
    start, end = f"<!-- {benchmark}: {key} -->", f"<!-- /{benchmark}: {key} -->"
    text = "# Benchmark results\n"
    if os.path.exists(RESULTS):
        with open(RESULTS, encoding="utf-8") as fh:
            text = fh.read()
    section = f"{start}\n{body.rstrip()}\n{end}\n"
    if start in text and end in text:
        text = text[:text.index(start)] + section + text[text.index(end) + len(end) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(RESULTS, "w", encoding="utf-8") as fh:
        fh.write(text)


class ProcessTreeMemory:
    """Samples the RSS of a process and all its descendants while in a `with`
    block: the peak of each process and the peak of their sum."""

    def __init__(self, pid: int | None = None, every_s: float = 0.5):
        self._pid = pid or os.getpid()
        self._every_s = every_s
        self.peak_by_process: dict[str, int] = {}
        self.peak_total = 0
        self._stop = threading.Event()

    def _sample(self) -> None:
        import psutil

        root = psutil.Process(self._pid)
        while not self._stop.is_set():
            total = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                procs = [root]
            for proc in procs:
                try:
                    rss = proc.memory_info().rss
                    name = f"{proc.pid} {' '.join(proc.cmdline()[:3])[:80]}"
                except psutil.Error:
                    continue
                total += rss
                self.peak_by_process[name] = max(self.peak_by_process.get(name, 0), rss)
            self.peak_total = max(self.peak_total, total)
            time.sleep(self._every_s)

    def __enter__(self) -> "ProcessTreeMemory":
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, top: int = 5) -> str:
        gib = 2 ** 30
        worst = sorted(self.peak_by_process.items(), key=lambda kv: -kv[1])[:top]
        return (f"peak RSS of the process tree {self.peak_total / gib:.2f} GiB; by process: "
                + "; ".join(f"{name} {rss / gib:.2f} GiB" for name, rss in worst))
