"""The index on disk: immutable segments, versioned by manifests.

```
INDEX/
  CURRENT                      name of the live manifest ("v000003"); replaced atomically, last
  LEASE                        while a job writes: who holds the index (owner, pid, host, segment)
  versions/v000003.json        manifest: segments, tombstones, stats, config, checksums
  segments/<segment-id>/       written once, never modified
     nodes-SSSSS-of-NNNNN.parquet     chunks-SSSSS-of-NNNNN.parquet     pages-SSSSS-of-NNNNN.parquet
     edges-SSSSS-of-NNNNN.parquet
     postings-SSSSS-of-NNNNN.parquet  vocabulary-SSSSS-of-NNNNN.parquet
     dense-SSSSS-of-NNNNN.faiss       vectors-SSSSS-of-NNNNN.zarr.zip
     bm25.json  dense.json  dense_trained.faiss  dead_letters.parquet  counts.json (builds, updates)
     site_bases.json (builds without --base_url)  tombstones.parquet (updates)
```

This module is the one home of that format: the names below, the manifest, the
checksummed open (`IndexLayout.verified_path`); reading a version's rows (a
row is live unless a later segment tombstoned its id) is ritrag/reader.py's,
BM25's parameters and statistics are ritrag/bm25.py's. Jobs, the server,
`ritrag inspect` and the benchmarks name files only through it.

Files are reached through ritrag/storage.py, local or remote (gs://, s3://, ...),
so the same code publishes to local disk or an object store, and `IndexLayout`
is the one reader of CURRENT and the manifests there: for the jobs, the index
commands and the server's mirror (ritrag.serving.remote) alike.
A manifest is published only after every file it names is complete, and CURRENT
is replaced after the manifest: a crash at any point leaves the previous version
fully servable.

Names are read from files (CURRENT, manifests) and from users (rollback), so
every version and segment name is checked against one pattern before it
becomes a path: none can point outside the index. Writers exclude each other
with a lease (ritrag/lease.py); docs/OPERATING.md says what is locked and how.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field, fields
from typing import Any, Iterable

from ritrag.embedder import MAX_EMBEDDING_DIMENSION
from ritrag.flags import option
from ritrag.index_config import ManifestConfig
from ritrag.lease import lease_holder
from ritrag.representation import DEFAULT_RETRIEVAL
from ritrag.schema import TOMBSTONES_SCHEMA
from ritrag.storage import (dir_exists, file_size, is_remote, list_dirs, list_files, open_read, remove_file,
                            remove_tree, sha256_file, write_atomic)

# 2: vocabulary sharded by term (vocabulary-SSSSS-of-NNNNN.parquet, was vocabulary.parquet)
# 3: df per field in the vocabulary; each segment's serving form (serving-SSSSS-of-NNNNN.arrays)
FORMAT_VERSION = 3
# Formats the jobs still read: a format-2 index is compacted (or updated) into
# format-3 segments without a rebuild; a server serves only segments that
# carry their serving form (ritrag.serving.segments says to compact).
READABLE_FORMATS = (2, FORMAT_VERSION)
TOMBSTONES_FILE = "tombstones.parquet"  # ids that this segment supersedes or deletes in earlier ones
BM25_STATS_FILE = "bm25.json"  # the segment's chunk and term counts (signed in an update's delta)
DENSE_INFO_FILE = "dense.json"  # factory string, nprobe, rerank, dimension of the dense shards
DENSE_TRAINED_FILE = "dense_trained.faiss"  # the trained empty index: later segments add to a copy of it
DEAD_LETTERS_FILE = "dead_letters.parquet"
SITE_BASES_FILE = "site_bases.json"  # each site's inferred public base, when --base_url was not given
COUNTS_FILE = "counts.json"  # the job's counts by name (transforms/counts.py): what the manifest's counts record
LOG = logging.getLogger("ritrag.layout")
_VERSION_RE = re.compile(r"^v(\d{6})$")
_SEGMENT_RE = re.compile(r"^seg-v\d{6}$")
_SHARD_RE = re.compile(r"^(?P<kind>[a-z_]+)-(?P<shard>\d{5})-of-(?P<num>\d{5})\.(?P<ext>\w+)$")


class IndexLoadError(Exception):
    """Base of the errors a reader raises for a missing or damaged index."""


class DamagedIndexError(IndexLoadError):
    """A file's bytes do not match the checksum its manifest recorded."""


class MissingIndexError(IndexLoadError):
    """No published version, or a file the manifest names is absent."""


class UnknownVersionError(MissingIndexError):
    """A version asked for by name that the index does not hold (never published, or pruned)."""


class IndexNameError(IndexLoadError, ValueError):
    """A version or segment name that does not match its pattern."""


def checked_version(name: object) -> str:
    """`name` if it is a version name (v000042), else IndexNameError."""
    if not isinstance(name, str) or not _VERSION_RE.match(name):
        raise IndexNameError(f"{name!r} is not a version name (v followed by six digits, e.g. v000003)")
    return name


def checked_segment_id(name: object) -> str:
    """`name` if it is a segment id (seg-v000042), else IndexNameError."""
    if not isinstance(name, str) or not _SEGMENT_RE.match(name):
        raise IndexNameError(f"{name!r} is not a segment id (seg-v followed by six digits)")
    return name


def shard_file_name(kind: str, shard: int, num_shards: int, ext: str) -> str:
    return f"{kind}-{shard:05d}-of-{num_shards:05d}.{ext}"


def parse_shard_file_name(name: str) -> tuple[str, int, int] | None:
    m = _SHARD_RE.match(name)
    if not m:
        return None
    return m["kind"], int(m["shard"]), int(m["num"])


def version_name(number: int) -> str:
    return f"v{number:06d}"


def segment_id_for(version: str) -> str:
    """The segment a job writes for the version it will publish."""
    return f"seg-{version}"


@dataclass(frozen=True)
class Manifest:
    """One published version of the index (the JSON in versions/)."""

    version: str
    parent: str | None
    created: float
    segments: list[dict[str, Any]]  # {"id", "files": {name: {"sha256", "bytes"}}, "num_shards", "counts"}
    tombstones: dict[str, int]  # live counts by column; the ids are in each segment's tombstones.parquet
    stats: dict[str, Any]
    config: dict[str, Any]  # as written (IndexConfig.to_manifest); readers read `settings`
    format_version: int = FORMAT_VERSION
    # The config typed, its older manifests' defaults applied: parsed once, as
    # the manifest is read (or made), so a config no reader could use is refused here.
    settings: ManifestConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "settings", ManifestConfig.from_manifest(self.config))

    def to_json(self) -> bytes:
        written = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return json.dumps(written, indent=1, sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> "Manifest":
        """The manifest in `data`; ValueError (or IndexNameError) when its
        structure or a name in it is not what a manifest holds."""
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError(f"a manifest is a JSON object, not {type(raw).__name__}")
        if raw.get("format_version") not in READABLE_FORMATS:
            raise IndexLoadError(f"unsupported index format {raw.get('format_version')!r} (this ritrag reads "
                                 f"formats {', '.join(map(str, READABLE_FORMATS))}): rebuild the index with this "
                                 f"version")
        written = {f.name for f in fields(cls) if f.init}
        if set(raw) != written:
            raise ValueError(f"fields differ from a manifest's: missing {sorted(written - set(raw))}, "
                             f"unknown {sorted(set(raw) - written)}")
        checked_version(raw["version"])
        if raw["parent"] is not None:
            checked_version(raw["parent"])
        if not isinstance(raw["segments"], list):
            raise ValueError("segments is not a list")
        for segment in raw["segments"]:
            if not (isinstance(segment, dict) and isinstance(segment.get("files"), dict)
                    and isinstance(segment.get("num_shards"), int)):
                raise ValueError("a segment is not an object with files and num_shards")
            checked_segment_id(segment.get("id"))
            for name, entry in segment["files"].items():
                if (os.path.basename(name) != name or name in ("", ".", "..") or not isinstance(entry, dict)
                        or not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("bytes"), int)):
                    raise ValueError(f"segment {segment['id']}: bad file entry {name!r}")
        check_manifest_values(raw)
        return cls(**raw)


# What a manifest may say of the numbers that size a reader's memory or work;
# anything else is refused at load (a manifest may come from an object store
# that a server does not control). Each is far past what a build writes.
MAX_FILE_BYTES = 1 << 50  # 1 PiB
MAX_COUNT = 1 << 53  # rows, chunks, pages, ...: past it, counts are no longer exact as JSON numbers
MAX_NUM_SHARDS = 99_999  # the widest a shard file name spells (shard_file_name)
MAX_NPROBE = 65_536  # inverted lists probed per query (FAISS allocates per probe)
MAX_RERANK = 100  # candidates re-ranked per k' chunks (transforms/dense.py chooses 1 to 8)
MAX_BM25 = {"k1": 100.0, "b": 1.0}
MAX_WEIGHT = 1e6  # retrieval weights and constants


def check_manifest_values(raw: dict[str, Any]) -> None:
    """ValueError naming the first field of the manifest `raw` (its JSON
    object, structure checked) that is of the wrong type or out of bounds:
    counts, file sizes, shard counts, the embedding dimension, dense search
    depth, BM25 and retrieval parameters. The rest of the config (the
    embedder's model, the representation, ...) its typed parse refuses
    (ManifestConfig.from_manifest, as the Manifest is made)."""
    _number("created", raw["created"], 0, MAX_COUNT)
    for column, value in _mapping("tombstones", raw["tombstones"]).items():
        _count(f"tombstones.{column}", value)
    _check_numbers("stats", _mapping("stats", raw["stats"]))
    for segment in raw["segments"]:
        where = f"segment {segment['id']}"
        _count(f"{where}: num_shards", segment["num_shards"], 1, MAX_NUM_SHARDS)
        for name, value in _mapping(f"{where}: counts", segment.get("counts", {})).items():
            _count(f"{where}: counts.{name}", value)
        for name, entry in segment["files"].items():
            _count(f"{where}: {name} bytes", entry["bytes"], 0, MAX_FILE_BYTES)
    config = _mapping("config", raw["config"])
    if "num_shards" in config:
        _count("config.num_shards", config["num_shards"], 1, MAX_NUM_SHARDS)
    embedder = _mapping("config.embedder", config.get("embedder"))
    if "dimension" in embedder:
        _count("config.embedder.dimension", embedder["dimension"], 1, MAX_EMBEDDING_DIMENSION)
    dense = _mapping("config.dense", config.get("dense", {}))
    for name, high in (("dim", MAX_EMBEDDING_DIMENSION), ("nprobe", MAX_NPROBE), ("rerank", MAX_RERANK),
                       ("n_vectors", MAX_COUNT), ("train_sample", MAX_COUNT)):
        if name in dense:
            _count(f"config.dense.{name}", dense[name], 1 if high != MAX_COUNT else 0, high)
    for name, value in _mapping("config.bm25", config.get("bm25", {})).items():
        _number(f"config.bm25.{name}", value, 0, MAX_BM25.get(name, 0))
    for name, value in _mapping("config.retrieval", config.get("retrieval") or {}).items():
        default = DEFAULT_RETRIEVAL.get(name)
        if isinstance(default, str):
            if not (isinstance(value, str) and len(value) <= 32):
                raise ValueError(f"config.retrieval.{name}: {_shown(value)} is not a name")
        elif default is not None:
            _number(f"config.retrieval.{name}", value, 0, MAX_WEIGHT)


def _mapping(field: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{field} is not an object but {type(value).__name__}")
    return value


def _shown(value: Any) -> str:
    """`value` as a message shows it: a few characters (10**400 must not fill the log)."""
    if isinstance(value, int) and abs(value) >= 10 ** 30:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _count(field: str, value: Any, low: int = 0, high: int = MAX_COUNT) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{field}: {_shown(value)} is not an integer from {low} to {high}")


def _number(field: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{field}: {_shown(value)} is not a number from {low} to {high}")


def _check_numbers(field: str, value: Any) -> None:
    """Every number in the JSON `value` finite and within +-MAX_COUNT (stats are shown, summed, exported)."""
    stack = [(field, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((f"{where}.{key}", v) for key, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(item))
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            _number(where, item, -MAX_COUNT, MAX_COUNT)


class IndexLayout:
    """Paths and publication protocol of one index directory."""

    def __init__(self, root: str):
        self.root = root

    def segment_dir(self, segment_id: str) -> str:
        return os.path.join(self.root, "segments", checked_segment_id(segment_id))

    def manifest_path(self, version: str) -> str:
        return os.path.join(self.root, "versions", f"{checked_version(version)}.json")

    @property
    def current_path(self) -> str:
        return os.path.join(self.root, "CURRENT")

    def versions(self) -> list[str]:
        names = (n[:-5] for n, _ in list_files(os.path.join(self.root, "versions")) if n.endswith(".json"))
        return sorted(n for n in names if _VERSION_RE.match(n))

    def next_version(self) -> str:
        existing = self.versions()
        last = int(existing[-1][1:]) if existing else 0
        return version_name(last + 1)

    def current_version(self) -> str | None:
        """The version CURRENT names; None when there is no CURRENT; a
        DamagedIndexError when it does not hold a version name; an
        IndexLoadError saying why when it cannot be read (a CURRENT this user
        may not read is no missing CURRENT)."""
        try:
            with open_read(self.current_path) as fh:
                data = fh.read(64)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise IndexLoadError(f"{self.current_path}: cannot be read ({type(exc).__name__}: {exc})") from exc
        name = data.decode("ascii", errors="replace").strip()
        if not _VERSION_RE.match(name):
            raise DamagedIndexError(f"{self.current_path}: does not hold a version name (it holds {data[:20]!r}); "
                                    "roll back to a version to repair it")
        return name

    def load_manifest(self, version: str | None = None) -> Manifest:
        version = version or self.current_version()
        if version is None:
            if not dir_exists(self.root):
                raise MissingIndexError(f"no index at {self.root}")
            raise MissingIndexError(f"{self.root}: no published version (CURRENT is missing)")
        path = self.manifest_path(version)
        try:
            with open_read(path) as fh:
                return Manifest.from_json(fh.read())
        except FileNotFoundError as exc:
            held = self.versions()
            raise UnknownVersionError(f"{self.root}: no version {version} (never published, or pruned); it holds "
                                      f"{', '.join(held) if held else 'no version'}") from exc
        except IndexNameError as exc:
            raise DamagedIndexError(f"{path}: {exc}") from exc
        except IndexLoadError as exc:
            raise type(exc)(f"{path}: {exc}") from exc
        except (ValueError, TypeError) as exc:
            raise DamagedIndexError(f"{path}: not a valid manifest ({exc})") from exc

    def describe_segment(self, segment_id: str, num_shards: int, counts: dict[str, int]) -> dict[str, Any]:
        """Checksum every file of a finished segment, for its manifest entry."""
        directory = self.segment_dir(segment_id)
        files = {name: {"sha256": sha256_file(os.path.join(directory, name)), "bytes": size}
                 for name, size in list_files(directory) if not name.startswith(".")}
        return {"id": segment_id, "num_shards": num_shards, "files": files, "counts": counts}

    def publish(self, manifest: Manifest) -> None:
        """Write the manifest, then flip CURRENT: the commit point of a build."""
        write_atomic(self.manifest_path(manifest.version), manifest.to_json())
        write_atomic(self.current_path, (manifest.version + "\n").encode("ascii"))

    def sized_path(self, segment: dict[str, Any], name: str) -> str:
        """Path of a segment file (local or remote) after checking that it is
        there at the size the manifest lists, its content unread: for a reader
        that checks each part it reads (the vector store's chunk CRCs,
        ritrag/vectors.py), to whom hashing the whole file would cost the file."""
        path = os.path.join(self.segment_dir(segment["id"]), name)
        expected = segment["files"].get(name)
        if expected is None:
            raise MissingIndexError(f"{path}: not listed in the manifest of segment {segment['id']}")
        size = file_size(path)
        if size is None:
            raise MissingIndexError(f"{path}: listed in the manifest but missing on disk")
        if size != expected["bytes"]:
            raise DamagedIndexError(f"{path}: damaged (its size differs from the manifest); refusing to load it")
        return path

    def verified_path(self, segment: dict[str, Any], name: str) -> str:
        """Path of a segment file (local or remote) after checking it against the manifest."""
        path = self.sized_path(segment, name)
        expected = segment["files"][name]
        if _seen_unchanged(path, expected["sha256"]):
            return path
        if sha256_file(path) != expected["sha256"]:
            raise DamagedIndexError(
                f"{path}: damaged (size or sha256 differs from the manifest); refusing to load it"
            )
        _remember_verified(path, expected["sha256"])
        return path

    def segment_files(self, segment: dict[str, Any], kind: str) -> list[str]:
        """Names of a segment's shard files of one kind, in shard order."""
        found = []
        for name in segment["files"]:
            parsed = parse_shard_file_name(name)
            if parsed and parsed[0] == kind:
                found.append((parsed[1], name))
        return [name for _, name in sorted(found)]


# Local segment files this process has hashed to their manifest's sha256, with
# the (size, mtime, inode) they had then. Segment files are written once, so
# the next version's load, which names most of the same files, hashes only the
# files it adds: a reload's verification follows its delta, not the index. A
# file rewritten since (another stat) is hashed again.
_VERIFIED: dict[tuple[str, str], tuple[int, int, int]] = {}


def file_identity(path: str) -> tuple[int, int, int] | None:
    """(size, mtime, inode) of a local file, which a rewrite changes; None for
    a remote object (its stat says too little) or a file gone."""
    if is_remote(path):
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns, stat.st_ino


def _seen_unchanged(path: str, sha256: str) -> bool:
    """Whether this process hashed the local file at `path` to `sha256` and it is unchanged since."""
    key = file_identity(path)
    return key is not None and _VERIFIED.get((os.path.abspath(path), sha256)) == key


def _remember_verified(path: str, sha256: str) -> None:
    key = file_identity(path)
    if key is not None:
        _VERIFIED[(os.path.abspath(path), sha256)] = key


def new_manifest(
    layout: IndexLayout,
    segments: Iterable[dict[str, Any]],
    stats: dict[str, Any],
    config: dict[str, Any],
    tombstones: dict[str, int] | None = None,
) -> Manifest:
    return Manifest(
        version=layout.next_version(),
        parent=layout.current_version(),
        created=time.time(),
        segments=list(segments),
        tombstones=tombstones or {name: 0 for name in TOMBSTONES_SCHEMA.names},
        stats=stats,
        config=config,
    )


def rollback(layout: IndexLayout, version: str) -> Manifest:
    """Make `version` live again, after checking that every file it names is intact."""
    manifest = layout.load_manifest(version)
    for segment in manifest.segments:
        for name in segment["files"]:
            layout.verified_path(segment, name)
    write_atomic(layout.current_path, (version + "\n").encode("ascii"))
    return manifest


def retained_versions(layout: IndexLayout, keep: int) -> dict[str, str]:
    """The versions `prune_versions` keeps, each with why: the `keep` newest,
    and the live one, which after a rollback may be older than those."""
    if keep < 1:
        raise ValueError("keep at least one version")
    versions = layout.versions()
    current = layout.current_version()
    why: dict[str, list[str]] = {}
    if current:
        why[current] = ["live (CURRENT names it)"]
    for version in versions[-keep:]:
        why.setdefault(version, []).append(f"one of the {keep} newest (--keep {keep})")
    return {version: " and ".join(reasons) for version, reasons in sorted(why.items())}


@dataclass(frozen=True)
class Publishing:
    """How a job that writes a version publishes it, and what `ritrag rollback` and
    `prune` take of it: their flags (ritrag.flags)."""

    keep_versions: int = option(10, "after publishing, delete older versions beyond this many "
                                    "(and the segments only they used)")
    break_lock: bool = option(False, "take the index's lease even if another job seems to hold it "
                                     "(only when that job is known to be gone; docs/OPERATING.md)")


@dataclass(frozen=True)
class RollbackTarget:
    """The version `rollback` makes live: `ritrag rollback`'s argument."""

    version: str = option(help="a published version, e.g. v000002 (ritrag versions lists them)", positional=True)


@dataclass(frozen=True)
class PruneRetention:
    """What `prune_versions` keeps when a person prunes: `ritrag prune`'s flag
    (a job keeps Publishing.keep_versions)."""

    keep: int = option(5, "newest versions kept (the live one always is)")


def prune_versions(layout: IndexLayout, keep: int) -> list[str]:
    """Delete every manifest but those `retained_versions` keeps, then every
    segment no remaining manifest names and no job is writing; returns what
    was deleted.

    The caller holds the index's lease, so the one segment a job may be
    writing is the one the lease records (ritrag.lease.lease_holder): every
    other segment no manifest names is garbage, whether an older prune died
    between deleting manifests and segments, or a job crashed before
    publishing. So a prune that dies anywhere is finished by the next one."""
    kept = retained_versions(layout, keep)
    deleted = []
    for version in layout.versions():
        if version not in kept:
            remove_file(layout.manifest_path(version))
            deleted.append(f"versions/{version}.json")
    referenced = {seg["id"] for v in kept for seg in layout.load_manifest(v).segments}
    writing = (lease_holder(layout.root) or {}).get("segment")
    # Only what is named like a segment: anything else under segments/ is not the index's to delete.
    segments_dir = os.path.join(layout.root, "segments")
    for segment_id in list_dirs(segments_dir):
        if segment_id not in referenced and segment_id != writing and _SEGMENT_RE.match(segment_id):
            remove_tree(os.path.join(segments_dir, segment_id))
            deleted.append(f"segments/{segment_id}")
    return deleted
