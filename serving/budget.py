"""Episode budgets (METHOD.md: at most 10 tool calls per question, at most 3 of
them GetToC), enforced per episode id that the caller passes.

Counters live in this process's memory, bounded: the least recently used
episodes are forgotten past `max_episodes`, and an episode idle for `idle_s`
starts afresh. Calls without an episode id are not counted.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from serving.errors import ToolError

GET_TOC = "GetToC"
READ = "Read"


@dataclass(frozen=True)
class Budget:
    calls: int = 10  # tool calls per episode, GetToC and Read together
    toc_calls: int = 3  # of which GetToC


@dataclass
class _Usage:
    calls: int = 0
    toc_calls: int = 0
    last_used: float = 0.0


class EpisodeBudgets:
    """Thread-safe per-episode call counters against one `Budget`."""

    def __init__(self, budget: Budget = Budget(), max_episodes: int = 100_000, idle_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic):
        self.budget = budget
        self._max_episodes = max_episodes
        self._idle_s = idle_s
        self._clock = clock
        self._usage: OrderedDict[str, _Usage] = OrderedDict()
        self._lock = threading.Lock()

    def charge(self, episode_id: str, tool: str) -> dict[str, int | str]:
        """Count one call of `tool` and return what is left; raise
        `ToolError("budget_exhausted")`, counting nothing, when the call
        would go over the budget."""
        with self._lock:
            now = self._clock()
            usage = self._usage.pop(episode_id, None)
            if usage is None or now - usage.last_used > self._idle_s:
                usage = _Usage()
            self._usage[episode_id] = usage  # most recently used last
            while len(self._usage) > self._max_episodes:
                self._usage.popitem(last=False)
            usage.last_used = now
            over_calls = usage.calls >= self.budget.calls
            over_toc = tool == GET_TOC and usage.toc_calls >= self.budget.toc_calls
            if not (over_calls or over_toc):
                usage.calls += 1
                usage.toc_calls += tool == GET_TOC
            left = self._left(episode_id, usage)
        if over_calls or over_toc:
            what = (f"all {self.budget.calls} tool calls" if over_calls
                    else f"all {self.budget.toc_calls} GetToC calls")
            hint = "; Read is still allowed" if not over_calls else "; answer with what you have read"
            raise ToolError("budget_exhausted", f"episode {episode_id!r} has used {what}{hint}",
                            budget=left)
        return left

    def _left(self, episode_id: str, usage: _Usage) -> dict[str, int | str]:
        calls_left = self.budget.calls - usage.calls
        return {"episode_id": episode_id, "calls_left": calls_left,
                "get_toc_left": min(calls_left, self.budget.toc_calls - usage.toc_calls)}

    def __len__(self) -> int:
        return len(self._usage)
