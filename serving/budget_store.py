"""Episode budgets and episode memory kept in Redis, shared by every replica.

An agent's calls may land on any replica behind the load balancer: with
`--budget_store redis://HOST:PORT/DB` the replicas count one episode's calls
in one place, and resolve the outline handles and read marks any of them
issued. The classes have the methods of `ritrag.serving.budget.EpisodeBudgets` and
`EpisodeMemory`, which stay the default for one process.

Per episode, keys under one hash tag (a Redis Cluster keeps them on one
shard), each expiring `idle_s` after the episode's last counted call:

    ritrag:{EPISODE}:budget   hash  calls, toc             (the budget)
    ritrag:{EPISODE}:seen     hash  answers, lines, seq    (counters of the memory)
    ritrag:{EPISODE}:handles  hash  letters -> "LINES:id\\nid..." (ids behind an answer's handles)
    ritrag:{EPISODE}:order    list  letters, oldest first
    ritrag:{EPISODE}:read     zset  node id -> sequence    (nodes Read returned)

A charge is one Lua script, so the check against the budget and the increment
are one atomic step however many replicas call at once.

When Redis does not answer (within `timeout_s`, after one retry), a call is
refused with `budget_store_unavailable` (HTTP 503) naming the store; with
`fail_open` it is served uncounted instead (no budget in the result, no
handles in the outline, handles unknown to Read), and the failure is counted
in /metrics either way. Nothing raises past the faces.
"""
from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable, Iterable, Sequence, TypeVar
from urllib.parse import urlsplit

from prometheus_client import Counter, Histogram

from ritrag.serving.budget import GET_TOC, Budget, charged
from ritrag.serving.errors import ToolError
from ritrag.serving.outline import HANDLE, answer_letters

LOG = logging.getLogger("ritrag.serving.budget_store")
T = TypeVar("T")

# KEYS: budget hash. ARGV: calls allowed, GetToC allowed, 1 if GetToC, expiry ms.
CHARGE = """
local calls = tonumber(redis.call('HGET', KEYS[1], 'calls') or '0')
local toc = tonumber(redis.call('HGET', KEYS[1], 'toc') or '0')
local over_calls = calls >= tonumber(ARGV[1]) and 1 or 0
local over_toc = (ARGV[3] == '1' and toc >= tonumber(ARGV[2])) and 1 or 0
if over_calls == 0 and over_toc == 0 then
  calls = redis.call('HINCRBY', KEYS[1], 'calls', 1)
  if ARGV[3] == '1' then toc = redis.call('HINCRBY', KEYS[1], 'toc', 1) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {calls, toc, over_calls, over_toc}
"""
# KEYS: handles hash, order list, seen hash. ARGV: letters, lines, ids, max lines kept, expiry ms.
STORE_HANDLES = """
local function lines_of(v) return tonumber(string.match(v, '^(%d+):')) end
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  redis.call('HINCRBY', KEYS[3], 'lines', -lines_of(old))
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[3])
redis.call('RPUSH', KEYS[2], ARGV[1])
local total = redis.call('HINCRBY', KEYS[3], 'lines', tonumber(ARGV[2]))
while total > tonumber(ARGV[4]) and redis.call('LLEN', KEYS[2]) > 1 do
  local oldest = redis.call('LPOP', KEYS[2])
  local v = redis.call('HGET', KEYS[1], oldest)
  redis.call('HDEL', KEYS[1], oldest)
  if v then total = redis.call('HINCRBY', KEYS[3], 'lines', -lines_of(v)) end
end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
return total
"""
# KEYS: read zset, seen hash. ARGV: max ids kept, expiry ms, then the node ids.
MARK_READ = """
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], redis.call('HINCRBY', KEYS[2], 'seq', 1), ARGV[i])
end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -tonumber(ARGV[1]) - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return redis.call('ZCARD', KEYS[1])
"""


def redis_location(url: str) -> str:
    """Where the Redis URL `url` points, without its credentials, for logs and
    errors; `invalid_arguments` unless it is redis[s]://[HOST][:PORT][/DB] or
    unix://PATH[?db=DB], PORT from 1 to 65535 and DB a non-negative integer
    (redis-py itself ignores a DB that is not a number and connects to 0)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise _bad_url(f"{url.split('://')[0][:20]!r} is neither memory nor a Redis URL")
    if parts.scheme == "unix":
        if not parts.path:
            raise _bad_url("unix:// names no socket path")
        return f"unix://{parts.path}"
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535
        port = 0
    if port == 0 or not re.fullmatch(r"/?([0-9]{1,9}/?)?", parts.path):
        raise _bad_url(f"{parts.netloc.rpartition('@')[2][:60]}{parts.path[:20]}: the port must be a number from "
                       "1 to 65535 and the database a non-negative integer")
    return f"{parts.scheme}://{parts.hostname or ''}{f':{port}' if port else ''}{parts.path}"


def _bad_url(problem: str) -> ToolError:
    return ToolError("invalid_arguments", f"budget store: {problem} (expected redis://HOST:PORT/DB)")


class RedisStore:
    """One Redis connection pool, its scripts, and how its failures are met:
    each operation is timed and its failure counted (both exported to
    /metrics), then refused with a 503 or, with `fail_open`, answered with
    a fallback."""

    def __init__(self, url: str, fail_open: bool = False, timeout_s: float = 0.5, prefix: str = "ritrag"):
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ToolError("invalid_arguments", "a Redis budget store needs the redis package: "
                            "pip install 'ritrag[redis]'") from None
        self.where = redis_location(url)
        try:
            # One retry: a pooled connection that Redis closed (a restart) is replaced without failing the call.
            self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                               retry=Retry(NoBackoff(), 1), decode_responses=True)
        except ValueError as exc:  # a query argument redis-py refuses (?socket_timeout=x)
            raise _bad_url(f"{self.where}: {exc}") from None
        self._errors_type = redis.RedisError
        self.fail_open = fail_open
        self.prefix = prefix
        self.charge_script = self.client.register_script(CHARGE)
        self.store_handles_script = self.client.register_script(STORE_HANDLES)
        self.mark_read_script = self.client.register_script(MARK_READ)
        # Collected by the HTTP face's registry (serving.http), not a global one.
        self.latency = Histogram("ritrag_budget_store_seconds", "Latency of the shared episode store, per operation",
                                 ["op"], buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1),
                                 registry=None)
        self.errors = Counter("ritrag_budget_store_errors", "Operations of the shared episode store that failed",
                              ["op"], registry=None)
        self._last_logged = 0.0

    def key(self, episode_id: str, kind: str) -> str:
        return f"{self.prefix}:{{{episode_id}}}:{kind}"

    def run(self, op: str, call: Callable[[], T], fallback: T) -> T:
        """`call()`, timed; when Redis fails: a `budget_store_unavailable`
        ToolError, or `fallback` when failing open."""
        start = time.perf_counter()
        try:
            return call()
        except self._errors_type as exc:
            self.errors.labels(op).inc()
            now = time.monotonic()
            if now - self._last_logged > 10:  # one line per 10 s of outage, not one per call
                self._last_logged = now
                LOG.warning("episode store %s failed (%s: %s); %s", self.where, type(exc).__name__, exc,
                            "serving calls uncounted" if self.fail_open else "refusing counted calls")
            if self.fail_open:
                return fallback
            raise ToolError("budget_store_unavailable", f"the shared episode store ({self.where}) did not answer "
                            f"({type(exc).__name__}); retry shortly", store=self.where) from None
        finally:
            self.latency.labels(op).observe(time.perf_counter() - start)

    def ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except self._errors_type:
            return False

    def collect(self) -> Iterable[Any]:
        """The store's metric families, for a registry's collector."""
        yield from self.latency.collect()
        yield from self.errors.collect()


class RedisEpisodeBudgets:
    """`EpisodeBudgets` in Redis: one atomic check-and-count per call."""

    def __init__(self, store: RedisStore, budget: Budget = Budget(), idle_s: float = 3600.0):
        self.store = store
        self.budget = budget
        self.expiry_ms = max(1, int(idle_s * 1000))

    def charge(self, episode_id: str, tool: str) -> dict[str, int | str] | None:
        """As `EpisodeBudgets.charge`; None when the store failed open (the call is not counted)."""
        args = [self.budget.calls, self.budget.toc_calls, int(tool == GET_TOC), self.expiry_ms]
        found = self.store.run("charge", lambda: self.store.charge_script(
            keys=[self.store.key(episode_id, "budget")], args=args), None)
        if found is None:
            return None
        calls, toc_calls, over_calls, over_toc = (int(v) for v in found)
        return charged(self.budget, episode_id, calls, toc_calls, bool(over_calls), bool(over_toc))


class RedisEpisodeMemory:
    """`EpisodeMemory` in Redis: handles and read marks any replica issued."""

    def __init__(self, store: RedisStore, idle_s: float = 3600.0, max_handles: int = 1_000, max_read: int = 200):
        self.store = store
        self.expiry_ms = max(1, int(idle_s * 1000))
        self.max_handles = max_handles
        self.max_read = max_read

    def issue_handles(self, episode_id: str, node_ids: Sequence[str]) -> str | None:
        """As `EpisodeMemory.issue_handles`; None when the store failed open
        (the outline then names nodes by their ids)."""
        key = self.store.key

        def issue() -> str:
            letters = answer_letters(self.store.client.hincrby(key(episode_id, "seen"), "answers", 1) - 1)
            self.store.store_handles_script(
                keys=[key(episode_id, "handles"), key(episode_id, "order"), key(episode_id, "seen")],
                args=[letters, len(node_ids), "\n".join(node_ids), self.max_handles, self.expiry_ms])
            return letters

        return self.store.run("issue_handles", issue, None)

    def resolve(self, episode_id: str | None, handles: Iterable[str]) -> tuple[dict[str, str], list[str]]:
        handles = list(handles)
        matches = [HANDLE.fullmatch(h) for h in handles]
        letters = sorted({m.group(1) for m in matches if m})
        stored: dict[str, str] = {}
        if episode_id and letters:
            values = self.store.run("resolve", lambda: self.store.client.hmget(
                self.store.key(episode_id, "handles"), letters), [None] * len(letters))
            stored = {ls: v for ls, v in zip(letters, values) if v}
        resolved, unknown = {}, []
        for handle, match in zip(handles, matches):
            value = stored.get(match.group(1)) if match else None
            lines, _, ids = value.partition(":") if value else ("0", "", "")
            line = int(match.group(2)) if match else 0
            if 0 < line <= int(lines):
                resolved[handle] = ids.split("\n")[line - 1]
            else:
                unknown.append(handle)
        return resolved, unknown

    def mark_read(self, episode_id: str, node_ids: Iterable[str]) -> None:
        key = self.store.key
        args = [self.max_read, self.expiry_ms, *node_ids]
        self.store.run("mark_read", lambda: self.store.mark_read_script(
            keys=[key(episode_id, "read"), key(episode_id, "seen")], args=args), None)

    def read_ids(self, episode_id: str | None) -> frozenset[str]:
        if not episode_id:
            return frozenset()
        return frozenset(self.store.run("read_ids", lambda: self.store.client.zrange(
            self.store.key(episode_id, "read"), 0, -1), []))


def redis_episode_state(url: str, budget: Budget, fail_open: bool = False, idle_s: float = 3600.0,
                        timeout_s: float = 0.5) -> tuple[RedisEpisodeBudgets, RedisEpisodeMemory]:
    """Budgets and memory over one Redis store at `url`."""
    store = RedisStore(url, fail_open=fail_open, timeout_s=timeout_s)
    return RedisEpisodeBudgets(store, budget, idle_s), RedisEpisodeMemory(store, idle_s)
