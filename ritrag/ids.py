"""Deterministic identifiers (a page's location key is its URL as
`ritrag.urls.normalize_url` spells it).

Every id is a pure function of content or location, so a retried bundle (or a
rebuild of the same input) writes the same bytes.

* Node ids are 12 lowercase base32 characters (60 bits of BLAKE2b): short enough
  for an agent to copy, wide enough that 30M pages collide with probability
  about 4e-4 (and the forest step checks for collisions).
* Chunk ids are 63-bit non-negative integers, the ids FAISS stores.
* A node id's *key* (`node_keys`) is the same 60 bits as an unsigned integer,
  for the serving form's binary searches: an integer compares in one
  instruction where a 12-byte string compares byte by byte.
"""
from __future__ import annotations

import base64
import hashlib

import numpy as np

NODE_ID_CHARS = 12
# The base32 digits in byte order, so that keys sort as the ids they encode.
_KEY_DIGITS = "".join(sorted("abcdefghijklmnopqrstuvwxyz234567")).encode("ascii")
_DIGIT_OF = np.full(256, 32, np.uint8)
_DIGIT_OF[np.frombuffer(_KEY_DIGITS, np.uint8)] = np.arange(32, dtype=np.uint8)
SHORT_ID_BYTES = 7  # a hand-made id this short (tests, tools) keys as its bytes, flagged by the top bit
_SHORT = np.uint64(1 << 63)
NO_NODE_KEY = np.uint64(2 ** 64 - 1)  # the key of an id that is neither: no node holds it


def _digest(*parts: str, size: int) -> bytes:
    h = hashlib.blake2b(digest_size=size)
    for part in parts:
        data = part.encode("utf-8")
        # Length prefix: ("ab", "c") and ("a", "bc") must not hash alike.
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


def node_id_for(key: str) -> str:
    """Node id of a node whose location key is `key` (a normalized URL, or a
    page URL plus a section path for section nodes)."""
    raw = _digest("node", key, size=8)
    return base64.b32encode(raw).decode("ascii").lower()[:NODE_ID_CHARS]


def chunk_id_for(node_id: str, ordinal: int, text: str) -> int:
    """63-bit chunk id: changes whenever the chunk's node, place or text changes."""
    raw = _digest("chunk", node_id, str(ordinal), text, size=8)
    return int.from_bytes(raw, "little") & ((1 << 63) - 1)


def content_hash(text: str) -> str:
    """Hex digest used to detect changed pages and to key the embedding cache."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def raw_hash(data: bytes) -> str:
    """Hex digest of an input file's bytes: equal bytes need no re-parse."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def shard_of(chunk_or_node_id: int | str, num_shards: int) -> int:
    """Shard that owns an id; stable across runs and runners."""
    if isinstance(chunk_or_node_id, int):
        return chunk_or_node_id % num_shards
    return int.from_bytes(_digest("shard", chunk_or_node_id, size=8), "little") % num_shards


def node_keys(ids: np.ndarray) -> np.ndarray:
    """The uint64 key of each node id of `ids` (fixed-width bytes, `S<w>`): a
    node id of 12 base32 characters is its 60 bits, digits ordered as bytes
    are, so keys sort as the ids do; an id of at most SHORT_ID_BYTES bytes
    (hand-made indexes) is 2^63 + its bytes, big-endian; any other id is
    NO_NODE_KEY, which no node holds. Memory: a few bytes per id beyond the
    keys (a version's millions of ids are keyed at load)."""
    n, width = len(ids), ids.dtype.itemsize
    raw = np.ascontiguousarray(ids).view(np.uint8).reshape(n, width)
    if width < NODE_ID_CHARS:  # padded with NULs, which are no digits
        raw = np.pad(raw, ((0, 0), (0, NODE_ID_CHARS - width)))
    digits = _DIGIT_OF[raw[:, :NODE_ID_CHARS]]
    canonical = digits.max(axis=1) < 32
    if width > NODE_ID_CHARS:
        canonical &= ~raw[:, NODE_ID_CHARS:].any(axis=1)
    digits &= np.uint8(31)
    # The 5-bit digits packed two at a time, then three pairs, then the two
    # 30-bit halves: a few passes over the ids, not one per digit.
    pairs = (digits[:, 0::2].astype(np.uint16) << 5) | digits[:, 1::2]
    halves = (pairs[:, 0::3].astype(np.uint32) << 20) | (pairs[:, 1::3].astype(np.uint32) << 10) | pairs[:, 2::3]
    keys = (halves[:, 0].astype(np.uint64) << np.uint64(30)) | halves[:, 1]
    other = np.flatnonzero(~canonical)  # short ids and ids that are none: few, or none
    if len(other):
        rest = raw[other]
        short = np.zeros((len(other), 8), np.uint8)
        short[:, 8 - SHORT_ID_BYTES:] = rest[:, :SHORT_ID_BYTES]
        fits = ~rest[:, SHORT_ID_BYTES:].any(axis=1)
        keys[other] = np.where(fits, short.view(">u8").reshape(-1).astype(np.uint64) | _SHORT, NO_NODE_KEY)
    return keys


def node_ids_of_keys(keys: np.ndarray) -> list[str]:
    """The node ids of keys `node_keys` made (not NO_NODE_KEY)."""
    keys = np.asarray(keys, np.uint64)
    digits = np.frombuffer(_KEY_DIGITS, np.uint8)[
        (keys[:, None] >> np.arange(5 * (NODE_ID_CHARS - 1), -1, -5, dtype=np.uint64)) & np.uint64(31)]
    short = ((keys[:, None] >> np.arange(8 * (SHORT_ID_BYTES - 1), -1, -8, dtype=np.uint64)) & np.uint64(255)
             ).astype(np.uint8)
    return [bytes(s).rstrip(b"\0").decode("ascii") if k & _SHORT else bytes(d).decode("ascii")
            for k, d, s in zip(keys.tolist(), digits, short)]
