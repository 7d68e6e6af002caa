"""Chunk vectors at rest: one zarr store per shard, read memory-mapped for exact re-ranking.

A shard's store is `vectors-SSSSS-of-NNNNN.zip`: a zarr v3 group in an
uncompressed (ZIP_STORED) zip archive, so the segment stays a flat list of files
that the manifest checksums one by one. It holds two arrays:

    ids      int64  (n,)        chunk ids, unique and ascending; one zarr chunk
    vectors  float16 (n, dim)   row i is the vector of ids[i]; zarr chunks of
                                CHUNK_ROWS rows, codec "bytes" (little endian),
                                no compressor

Any zarr v3 reader opens it (`zarr.open_group(zarr.storage.ZipStore(path))`),
which is how an index is rebuilt or retrained without re-embedding. The server
does not go through zarr: zarr reads whole chunks, so 800 random rows of a
1M-row shard cost 0.5-0.75 s (benchmarks/RESULTS.md, "Dense recall"). Because every
chunk is stored uncompressed, its bytes lie contiguous in the archive, and
`VectorShard` maps the file (mmap) and gathers any rows with one numpy fancy
index: 1.1 ms for 800 rows over ten 1M-row shards, and loading costs nothing
but the zip's directory. The file's name says which shard it is, and a chunk id
is looked up only in the shard that owns it (`chunk_id % num_shards`).

The archive is written deterministically (members in key order, fixed
timestamps, data padded to 64-byte boundaries), so the same vectors give the
same bytes. Nothing is unpickled.
"""
from __future__ import annotations

import io
import json
import mmap
import os
import shutil
import struct
import tempfile
import zipfile
import zlib
from typing import BinaryIO, Iterator, Sequence

import numpy as np

from ritrag.layout import DamagedIndexError, parse_shard_file_name
from ritrag.storage import is_remote, open_read

VECTORS_KIND = "vectors"
VECTORS_EXTENSION = "zip"
# Rows per zarr chunk of the vectors array: a streamed rebuild holds one chunk
# at a time, and zarr v3 stores the last chunk padded to full size, so the
# waste per shard is under one chunk (12 MiB at 384 dims).
CHUNK_ROWS = 16_384
_BYTES_CODEC = [{"name": "bytes", "configuration": {"endian": "little"}}]
_CHUNK_KEYS = {"name": "default", "configuration": {"separator": "/"}}
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can record: no build time leaks into the bytes
_LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # zip local file header, up to the name
_LOCAL_SIGNATURE = b"PK\x03\x04"
# Member data starts on a 64-byte boundary (padded by an extra field, as Android's
# zipalign does): numpy searches unaligned memory-mapped ids only after copying
# them whole (measured: 0.17 ms instead of 0.001 ms per search of a 1M-id shard).
_ALIGN = 64
_PADDING_FIELD = 0xD935


class MissingVectorsError(LookupError):
    """Chunk ids asked for that no shard of the store holds."""

    def __init__(self, chunk_ids: np.ndarray):
        self.chunk_ids = chunk_ids
        shown = ", ".join(str(i) for i in chunk_ids[:5].tolist())
        super().__init__(f"{len(chunk_ids)} chunk id(s) have no stored vector (first: {shown}); "
                         "the vector store does not belong to this dense index")


def write_vectors(out: BinaryIO, ids: np.ndarray, vectors: np.ndarray) -> None:
    """Write one shard's store to the binary stream `out`.

    `ids` must be unique and ascending (the row order of the store); `vectors`
    are stored as float16.
    """
    import zarr  # a dependency of the build only: readers need numpy alone
    from zarr.storage import LocalStore

    if ids.ndim != 1 or vectors.ndim != 2 or len(ids) != len(vectors):
        raise ValueError(f"ids {ids.shape} and vectors {vectors.shape} do not pair up")
    if np.any(np.diff(ids) <= 0):
        raise ValueError("chunk ids of a vector shard must be unique and ascending")
    n, dim = vectors.shape
    with tempfile.TemporaryDirectory(prefix="ritrag-vectors-") as tmp:
        store_dir = os.path.join(tmp, "store")
        group = zarr.open_group(LocalStore(store_dir), mode="w")
        # write_empty_chunks: a chunk equal to the fill value must still be a
        # member, or the memory-mapped reader would find a hole.
        arrays = {
            "ids": (ids.astype(np.int64, copy=False), (max(n, 1),)),
            "vectors": (vectors.astype(np.float16, copy=False), (max(min(n, CHUNK_ROWS), 1), dim)),
        }
        for name, (data, chunks) in arrays.items():
            array = group.create_array(name, shape=data.shape, chunks=chunks, dtype=data.dtype,
                                       compressors=None, filters=None, fill_value=0,
                                       config={"write_empty_chunks": True})
            if n:
                array[...] = data
        archive = os.path.join(tmp, "store.zip")
        _zip_deterministically(store_dir, archive)
        with open(archive, "rb") as fh:
            shutil.copyfileobj(fh, out, 1 << 20)


def _zip_deterministically(directory: str, archive: str) -> None:
    paths = sorted(os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
                   for root, _, names in os.walk(directory) for name in names)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for key in paths:
            source = os.path.join(directory, key)
            info = zipfile.ZipInfo(key, date_time=_ZIP_TIME)
            info.create_system = 3  # otherwise the writer's OS would show in the bytes
            info.external_attr = 0o644 << 16
            info.file_size = os.path.getsize(source)  # lets zipfile decide on ZIP64 up front
            unpadded = zf.fp.tell() + _LOCAL_HEADER.size + len(key.encode()) + 4
            info.extra = struct.pack("<HH", _PADDING_FIELD, -unpadded % _ALIGN) + bytes(-unpadded % _ALIGN)
            with open(source, "rb") as src, zf.open(info, "w") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def _map_or_read(path: str, populate: bool) -> mmap.mmap | bytes:
    """A local file memory-mapped; a remote one (jobs only) read whole."""
    if is_remote(path):
        with open_read(path) as fh:
            return fh.read()
    # MAP_POPULATE maps every page up front: otherwise each of the first reads of a
    # row faults (measured: 6.6 ms instead of 1.1 ms CPU to gather 800 rows of 10M).
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    with open(path, "rb") as fh:
        return mmap.mmap(fh.fileno(), 0, flags=flags, prot=mmap.PROT_READ)


class VectorShard:
    """One shard's store, memory-mapped: `ids`, and rows read by position.

    `populate`: map every page at open (a server's choice; a job reading a few rows
    would read the whole file for nothing). `checked`: for a file not hashed
    against its manifest (`IndexLayout.sized_path`): the ids are checked
    against the zip's CRC-32 of their member at open, and each chunk of
    vectors the first time a row of it is read (12 MiB at 384 dimensions), so
    a job that reuses a few stored vectors reads nothing unchecked, and
    checks what it reads rather than every byte of the file; a mismatch is a
    DamagedIndexError.
    """

    def __init__(self, path: str, populate: bool = False, checked: bool = False):
        parsed = parse_shard_file_name(os.path.basename(path))
        if parsed is None or parsed[0] != VECTORS_KIND:
            raise ValueError(f"{path}: not named like a vector shard ({VECTORS_KIND}-SSSSS-of-NNNNN.zip)")
        self.path = path
        _, self.shard, self.num_shards = parsed
        self._buffer = _map_or_read(path, populate)
        with zipfile.ZipFile(io.BytesIO(self._buffer) if isinstance(self._buffer, bytes) else path) as zf:
            self._members = {info.filename: info for info in zf.infolist()}
            meta = {name: json.loads(zf.read(f"{name}/zarr.json")) for name in ("ids", "vectors")}
        n, self.dim = meta["vectors"]["shape"]
        if meta["ids"]["shape"] != [n]:
            raise ValueError(f"{path}: {meta['ids']['shape']} ids for {n} vectors")
        id_offsets, id_rows, id_keys = self._chunk_offsets("ids", meta["ids"], "int64")
        if checked:
            for key, offset in zip(id_keys, id_offsets.tolist()):
                self._check(key, offset)
        id_chunks = [np.frombuffer(self._buffer, "<i8", count=min(id_rows, n - c * id_rows), offset=int(offset))
                     for c, offset in enumerate(id_offsets)]
        # one chunk (as written here) stays a view of the file: no copy in memory
        self.ids: np.ndarray = id_chunks[0] if len(id_chunks) == 1 else np.concatenate(
            id_chunks or [np.zeros(0, np.int64)])
        self._offsets, self._chunk_rows, self._keys = self._chunk_offsets("vectors", meta["vectors"], "float16")
        self._row_bytes = 2 * self.dim
        # The vectors chunks not yet checked against their CRC-32 (None: the
        # file was hashed whole, or its reader trusts it).
        self._unchecked: set[int] | None = set(range(len(self._offsets))) if checked else None
        # Row i of this view is the `_row_bytes` bytes from offset i of the file, so
        # rows of any chunks are gathered by one fancy index (no loop over chunks).
        self._windows = (np.lib.stride_tricks.sliding_window_view(np.frombuffer(self._buffer, np.uint8),
                                                                  self._row_bytes) if n else None)

    def __len__(self) -> int:
        return len(self.ids)

    def _chunk_offsets(self, name: str, meta: dict, dtype: str) -> tuple[np.ndarray, int, list[str]]:
        """File offsets of an array's chunks (chunked along axis 0 only), rows per
        chunk, and the chunks' member names."""
        shape = meta.get("shape", [])
        grid = meta.get("chunk_grid", {})
        chunk_shape = grid.get("configuration", {}).get("chunk_shape", [])
        if (meta.get("zarr_format") != 3 or meta.get("data_type") != dtype
                or meta.get("codecs") != _BYTES_CODEC or meta.get("chunk_key_encoding") != _CHUNK_KEYS
                or grid.get("name") != "regular" or len(chunk_shape) != len(shape)
                or chunk_shape[1:] != shape[1:]):
            raise ValueError(f"{self.path}: array {name!r} is not an uncompressed {dtype} array "
                             "chunked by rows (not written by ritrag.vectors)")
        rows = chunk_shape[0]
        chunk_bytes = int(np.prod(chunk_shape)) * np.dtype(dtype).itemsize
        keys = ["/".join([name, "c", str(c)] + ["0"] * (len(shape) - 1)) for c in range(-(-shape[0] // rows))]
        return np.array([self._data_offset(key, chunk_bytes) for key in keys], dtype=np.int64), rows, keys

    def _data_offset(self, key: str, size: int) -> int:
        """Where a stored zip member's bytes start in the file."""
        info = self._members.get(key)
        if info is None or info.compress_type != zipfile.ZIP_STORED or info.file_size != size:
            raise ValueError(f"{self.path}: chunk {key} is missing, compressed or of the wrong size")
        signature, *_, name_length, extra_length = _LOCAL_HEADER.unpack_from(self._buffer, info.header_offset)
        if signature != _LOCAL_SIGNATURE:
            raise ValueError(f"{self.path}: no zip local header for {key}")
        return info.header_offset + _LOCAL_HEADER.size + name_length + extra_length

    def rows_of(self, chunk_ids: np.ndarray) -> np.ndarray:
        """Row of each chunk id in this shard; -1 where the shard does not hold it."""
        if not len(self.ids):
            return np.full(len(chunk_ids), -1, np.int64)
        pos = np.minimum(np.searchsorted(self.ids, chunk_ids), len(self.ids) - 1)
        return np.where(self.ids[pos] == chunk_ids, pos, -1)

    def read(self, rows: np.ndarray) -> np.ndarray:
        """float16 vectors of the given (valid) rows, in the order asked."""
        if not len(rows):
            return np.zeros((0, self.dim), np.float16)
        chunk, within = np.divmod(rows, self._chunk_rows)
        if self._unchecked:
            for c in self._unchecked.intersection(chunk.tolist()):
                self._check(self._keys[c], int(self._offsets[c]))
                self._unchecked.discard(c)
        return self._windows[self._offsets[chunk] + within * self._row_bytes].view("<f2")

    def batches(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, float16 vectors) one zarr chunk at a time: memory-bounded streaming."""
        for c, offset in enumerate(self._offsets.tolist()):
            if self._unchecked:
                self._check(self._keys[c], offset)
                self._unchecked.discard(c)
            start = c * self._chunk_rows
            ids = self.ids[start: start + self._chunk_rows]
            yield ids, np.frombuffer(self._buffer, "<f2", count=len(ids) * self.dim,
                                     offset=offset).reshape(len(ids), self.dim)

    def _check(self, key: str, offset: int) -> None:
        """The bytes of the member `key`, from `offset`, against the CRC-32 the zip records for it."""
        info = self._members[key]
        if zlib.crc32(memoryview(self._buffer)[offset: offset + info.file_size]) != info.CRC:
            raise DamagedIndexError(f"{self.path}: damaged (the CRC-32 of {key} differs from the zip's); "
                                    "refusing to read it")


class VectorStore:
    """The vector shards of an index (of one or more segments), looked up by chunk id.

    A chunk id is looked for only in the shard that owns it in each segment
    (`chunk_id % num_shards`, as the build shards): searching every shard costs a
    binary search per shard and candidate (measured: 5.4 ms for 800 candidates
    over 10 shards of 1M, against 1.1 ms for the whole lookup and gather).
    """

    def __init__(self, shards: Sequence[VectorShard]):
        dims = {s.dim for s in shards}
        if len(dims) > 1:
            raise ValueError(f"vector shards of different dimensions: {sorted(dims)}")
        self.shards = list(shards)
        self.dim = dims.pop() if dims else 0
        self._segments: dict[tuple[str, int], dict[int, VectorShard]] = {}
        for shard in self.shards:
            segment = (os.path.dirname(shard.path), shard.num_shards)
            self._segments.setdefault(segment, {})[shard.shard] = shard

    @classmethod
    def open(cls, paths: Sequence[str], populate: bool = False, checked: bool = False) -> "VectorStore":
        """The shards at `paths` (VectorShard's `populate` and `checked`)."""
        return cls([VectorShard(p, populate, checked) for p in paths])

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards)

    def vectors(self, chunk_ids: np.ndarray) -> np.ndarray:
        """float32 vectors of `chunk_ids`, in that order; MissingVectorsError if any is unknown."""
        return self.stored_vectors(chunk_ids).astype(np.float32)

    def stored_vectors(self, chunk_ids: np.ndarray) -> np.ndarray:
        """The float16 vectors as stored, of `chunk_ids` in that order; MissingVectorsError
        if any is unknown."""
        chunk_ids = np.asarray(chunk_ids, dtype=np.int64)
        out = np.empty((len(chunk_ids), self.dim), np.float16)
        missing = np.ones(len(chunk_ids), bool)
        for (_, num_shards), shards in self._segments.items():
            owner = chunk_ids % num_shards
            for number, shard in shards.items():
                asked = np.flatnonzero(missing & (owner == number))
                rows = shard.rows_of(chunk_ids[asked])
                found = asked[rows >= 0]
                out[found] = shard.read(rows[rows >= 0])
                missing[found] = False
        if missing.any():
            raise MissingVectorsError(chunk_ids[missing])
        return out


# float32 of every float16 bit pattern (256 KiB: stays in cache).
_HALF_TO_FLOAT = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def rerank_exact(query_vector: np.ndarray, candidate_chunk_ids: np.ndarray, store: VectorStore
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Candidates re-scored by the exact inner product with their stored vectors:
    (chunk ids, scores), best first, ties broken by chunk id for determinism."""
    ids = np.asarray(candidate_chunk_ids, dtype=np.int64)
    # The float16 rows become float32 through a table of every half value: numpy's
    # own cast is a scalar loop, twice as slow (0.53 against 1.1 ms for 1,600 x 384;
    # the values are the same). einsum, unlike `@` (BLAS), stays on this thread:
    # OpenBLAS spreads a product of this size over threads, and waking them costs
    # milliseconds on a busy server (measured: 20 ms for 1,600 candidates).
    vectors = np.take(_HALF_TO_FLOAT, store.stored_vectors(ids).view(np.uint16))
    scores = np.einsum("ij,j->i", vectors, np.asarray(query_vector, np.float32).reshape(-1))
    order = np.lexsort((ids, -scores))
    return ids[order], scores[order]
