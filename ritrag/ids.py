"""Deterministic identifiers (a page's location key is its URL as
`ritrag.urls.normalize_url` spells it).

Every id is a pure function of content or location, so a retried bundle (or a
rebuild of the same input) writes the same bytes.

* Node ids are 12 lowercase base32 characters (60 bits of BLAKE2b): short enough
  for an agent to copy, wide enough that 30M pages collide with probability
  about 4e-4 (and the forest step checks for collisions).
* Chunk ids are 63-bit non-negative integers, the ids FAISS stores.
"""
from __future__ import annotations

import base64
import hashlib

NODE_ID_CHARS = 12


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
