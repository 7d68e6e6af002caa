"""Per-episode state, enforced and kept per episode id that the caller passes:
budgets (docs/METHOD.md: at most 10 tool calls per question, at most 3 of them
GetToC), and what the episode has seen (the outline handles each GetToC
answer issued, and the nodes Read returned).

Both live in this process's memory, bounded: the least recently used
episodes are forgotten past `max_episodes`, and an episode idle for `idle_s`
starts afresh. Calls without an episode id are not counted and keep no state.
Replicas behind one load balancer share both through Redis instead
(serving.budget_store, the same methods).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterable, Sequence, TypeVar

from ritrag.serving.errors import ToolError
from ritrag.serving.outline import HANDLE, answer_letters

GET_TOC = "GetToC"
READ = "Read"

State = TypeVar("State")


class _RecentEpisodes(Generic[State]):
    """Episode id -> state, LRU-bounded and reset after `idle_s`; callers
    hold `lock` while they use a state."""

    def __init__(self, new: Callable[[], State], max_episodes: int, idle_s: float, clock: Callable[[], float]):
        self._new = new
        self._max_episodes = max_episodes
        self._idle_s = idle_s
        self._clock = clock
        self._states: OrderedDict[str, tuple[State, float]] = OrderedDict()
        self.lock = threading.Lock()

    def touch(self, episode_id: str) -> State:
        """The episode's state (fresh when unknown or idle too long), now the
        most recently used."""
        now = self._clock()
        state, last_used = self._states.pop(episode_id, (None, now))
        if state is None or now - last_used > self._idle_s:
            state = self._new()
        self._states[episode_id] = (state, now)  # most recently used last
        while len(self._states) > self._max_episodes:
            self._states.popitem(last=False)
        return state

    def peek(self, episode_id: str) -> State | None:
        """The episode's state if it is kept and not idle too long; not a use."""
        state, last_used = self._states.get(episode_id, (None, 0.0))
        return state if state is not None and self._clock() - last_used <= self._idle_s else None

    def __len__(self) -> int:
        return len(self._states)


@dataclass(frozen=True)
class Budget:
    calls: int = 10  # tool calls per episode, GetToC and Read together
    toc_calls: int = 3  # of which GetToC


@dataclass
class _Usage:
    calls: int = 0
    toc_calls: int = 0


class EpisodeBudgets:
    """Thread-safe per-episode call counters against one `Budget`."""

    def __init__(self, budget: Budget = Budget(), max_episodes: int = 100_000, idle_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic):
        self.budget = budget
        self._usage = _RecentEpisodes(_Usage, max_episodes, idle_s, clock)

    def charge(self, episode_id: str, tool: str) -> dict[str, int | str]:
        """Count one call of `tool` and return what is left; raise
        `ToolError("budget_exhausted")`, counting nothing, when the call
        would go over the budget."""
        with self._usage.lock:
            usage = self._usage.touch(episode_id)
            over_calls = usage.calls >= self.budget.calls
            over_toc = tool == GET_TOC and usage.toc_calls >= self.budget.toc_calls
            if not (over_calls or over_toc):
                usage.calls += 1
                usage.toc_calls += tool == GET_TOC
            return charged(self.budget, episode_id, usage.calls, usage.toc_calls, over_calls, over_toc)

    def __len__(self) -> int:
        return len(self._usage)


def charged(budget: Budget, episode_id: str, calls: int, toc_calls: int, over_calls: bool, over_toc: bool
            ) -> dict[str, int | str]:
    """What is left of `budget` after an episode's `calls` (`toc_calls` of
    them GetToC); `ToolError("budget_exhausted")` when the call that asked
    was refused for going over the calls or the GetToC calls. Every budget
    store reports through this one function."""
    calls_left = budget.calls - calls
    left = {"episode_id": episode_id, "calls_left": calls_left,
            "get_toc_left": min(calls_left, budget.toc_calls - toc_calls)}
    if over_calls or over_toc:
        what = f"all {budget.calls} tool calls" if over_calls else f"all {budget.toc_calls} GetToC calls"
        hint = "; Read is still allowed" if not over_calls else "; answer with what you have read"
        raise ToolError("budget_exhausted", f"episode {episode_id!r} has used {what}{hint}", budget=left)
    return left


@dataclass
class _Seen:
    answers: int = 0  # outline answers issued so far; the next one gets answer_letters(answers)
    # letters -> (lines, the node ids by line joined with newlines: 13 bytes an id, not ~70 as a list)
    handles: OrderedDict[str, tuple[int, str]] = field(default_factory=OrderedDict)
    read: dict[str, None] = field(default_factory=dict)  # node ids Read returned, oldest first


class EpisodeMemory:
    """What each episode has seen, for handles and read marks; thread-safe.

    Per episode it keeps the node ids behind the handles of its most recent
    outline answers, at most `max_handles` ids in all (older answers are
    forgotten whole), and at most `max_read` read node ids (the oldest are
    forgotten). Worst case, about `max_episodes` x (13 `max_handles` + 100
    `max_read`) bytes (330 MB with the defaults); a typical episode (2
    answers of ~150 lines, 5 nodes read) holds about 5 KB.
    """

    def __init__(self, max_episodes: int = 10_000, idle_s: float = 3600.0, max_handles: int = 1_000,
                 max_read: int = 200, clock: Callable[[], float] = time.monotonic):
        self._seen = _RecentEpisodes(_Seen, max_episodes, idle_s, clock)
        self._max_handles = max_handles
        self._max_read = max_read

    def issue_handles(self, episode_id: str, node_ids: Sequence[str]) -> str:
        """Record an outline answer numbering `node_ids` (node 1 first: its
        lines, then its cross-links, ritrag.serving.outline.outline_ids) and
        return its handle letters: node i's handle is letters + str(i)."""
        with self._seen.lock:
            seen = self._seen.touch(episode_id)
            letters = answer_letters(seen.answers)
            seen.answers += 1
            seen.handles.pop(letters, None)  # letters come around again after 18,278 answers
            seen.handles[letters] = (len(node_ids), "\n".join(node_ids))
            while sum(lines for lines, _ in seen.handles.values()) > self._max_handles and len(seen.handles) > 1:
                seen.handles.popitem(last=False)
            return letters

    def resolve(self, episode_id: str | None, handles: Iterable[str]) -> tuple[dict[str, str], list[str]]:
        """(handle -> node id for those this episode issued and still keeps,
        the handles it does not know)."""
        with self._seen.lock:
            seen = self._seen.peek(episode_id) if episode_id else None
            resolved, unknown = {}, []
            for handle in handles:
                match = HANDLE.fullmatch(handle)
                lines, ids = seen.handles.get(match.group(1), (0, "")) if seen and match else (0, "")
                line = int(match.group(2)) if match else 0
                if 0 < line <= lines:
                    resolved[handle] = ids.split("\n")[line - 1]
                else:
                    unknown.append(handle)
            return resolved, unknown

    def mark_read(self, episode_id: str, node_ids: Iterable[str]) -> None:
        with self._seen.lock:
            seen = self._seen.touch(episode_id)
            for node_id in node_ids:
                seen.read.pop(node_id, None)
                seen.read[node_id] = None
            for old in list(seen.read)[:max(0, len(seen.read) - self._max_read)]:
                del seen.read[old]

    def read_ids(self, episode_id: str | None) -> frozenset[str]:
        """The node ids Read returned in this episode (empty without one)."""
        with self._seen.lock:
            seen = self._seen.peek(episode_id) if episode_id else None
            return frozenset(seen.read) if seen else frozenset()

    def __len__(self) -> int:
        return len(self._seen)
