"""Deterministic identifiers and URL normalization.

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
import posixpath
from urllib.parse import urlsplit, urlunsplit

NODE_ID_CHARS = 12

# File names that stand for their directory. `default.html` is left out: on
# documentation sites it is often a page of its own beside `index.html`
# (merging the two would lose one); a server that really serves it as the
# directory index names it by its canonical link, which the forest honours.
_INDEX_FILES = ("index.html", "index.htm", "index.php")


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


def normalize_url(url: str) -> str:
    """Canonical form used to recognise the same page under different spellings.

    Lowercases scheme and host, drops fragments, default ports, `index.html`-style
    file names and trailing slashes, and resolves `.`/`..` segments. The query
    string is kept: on many sites it selects a different page.
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if parts.port and not ((scheme, parts.port) in (("http", 80), ("https", 443))):
        host = f"{host}:{parts.port}"
    path = parts.path or "/"
    path = posixpath.normpath(path) if path not in ("", "/") else "/"
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    head, tail = posixpath.split(path)
    if tail.lower() in _INDEX_FILES:
        path = head
    path = path.rstrip("/") or "/"
    return urlunsplit((scheme, host, path, parts.query, ""))


def site_of(url: str, site_depth: int = 0) -> str:
    """Normalized URL of the site (forest root) that `url` belongs to: scheme, host
    and the first `site_depth` path segments (products hosted side by side under
    one host, `docs.example.com/<product>/...`, want `site_depth=1`)."""
    parts = urlsplit(normalize_url(url))
    segments = [s for s in parts.path.split("/") if s][:site_depth]
    path = "/" + "/".join(segments) if segments else "/"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))
