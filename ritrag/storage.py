"""The one storage layer of jobs, index commands, the lease (ritrag/lease.py)
and the server's mirror (ritrag/serving/remote.py): reads, writes, listing,
deletes and the lease's conditional writes, local or in an object store.

It is fsspec: one API over local disk, S3 (s3fs), GCS (gcsfs), Azure (adlfs)
and more, light enough for a server that must not import Beam. A local path
goes to the OS where it does better: atomic and exclusive writes, opening a
file (pyarrow reads a path natively), glob. Beam's file systems stay inside
the pipelines (sources, sinks, DoFns writing files on workers); Beam configures
them from the same options (ritrag.pipelines.launcher).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
from typing import Any, BinaryIO

READ_AHEAD = 4 << 20
# fsspec protocol -> the extra that installs its file system
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


class StoreUnavailableError(Exception):
    """The package of a URL's protocol is not installed, or the URL names no store."""


def is_remote(path: str) -> bool:
    """A URL (gs://, s3://, memory://, ...), not a local path."""
    return "://" in path


# Each protocol's settings from the job's or command's options
# (use_pipeline_options); None until configured. A protocol without any:
# fsspec's configuration and the store's defaults (the AWS chain, Application
# Default Credentials, STORAGE_EMULATOR_HOST).
_settings: dict[str, dict[str, Any]] | None = None


def use_pipeline_options(options: Any) -> None:
    """Configure every object store a job or a command reaches from `options`
    (Beam `PipelineOptions`, whose flags the jobs and the index commands
    take: S3Options' --s3_endpoint_url and keys, GoogleCloudOptions'
    --project). The settings stay in force for the process."""
    global _settings
    given = options.get_all_options()
    client = {"region_name": given.get("s3_region_name"), "api_version": given.get("s3_api_version"),
              "verify": given.get("s3_verify")}
    s3 = {"key": given.get("s3_access_key_id"), "secret": given.get("s3_secret_access_key"),
          "token": given.get("s3_session_token"), "endpoint_url": given.get("s3_endpoint_url"),
          "use_ssl": False if given.get("s3_disable_ssl") else None,
          "client_kwargs": {name: value for name, value in client.items() if value is not None} or None}
    gcs = {"project": given.get("project")}
    _settings = {protocol: {name: value for name, value in settings.items() if value is not None}
                 for protocols, settings in ((("s3", "s3a"), s3), (("gs", "gcs"), gcs)) for protocol in protocols}


def _store_settings(protocol: str) -> dict[str, Any]:
    """The settings of `protocol`; on a remote runner's worker, where DoFns read
    the live index but no `use_pipeline_options` ran, from the job's options
    that Beam's SDK harness gave Beam's FileSystems."""
    if _settings is None:
        beam = sys.modules.get("apache_beam.io.filesystems")
        options = getattr(beam.FileSystems, "_pipeline_options", None) if beam else None
        if options is not None:
            use_pipeline_options(options)
    return (_settings or {}).get(protocol, {})


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec file system, path in it) of `url` or a local path;
    StoreUnavailableError naming the pip command when the protocol's package
    is not installed."""
    import fsspec

    protocol = url.split("://", 1)[0] if is_remote(url) else "file"
    try:
        # No listing cache: Beam's sinks and other processes write the same
        # prefixes, and a cached listing would hide what they wrote.
        return fsspec.core.url_to_fs(url, use_listings_cache=False, **_store_settings(protocol))
    except ImportError as exc:
        hint = f"pip install 'ritrag[{EXTRAS[protocol]}]'" if protocol in EXTRAS else "install the package of that protocol"
        raise StoreUnavailableError(f"{protocol}:// needs a package that is not installed ({exc}): {hint}") from None
    except ValueError as exc:
        raise StoreUnavailableError(f"{url}: {exc}") from None


def exists(path: str) -> bool:
    fs, inner = filesystem(path)
    return fs.exists(inner)


def open_read(path: str) -> BinaryIO:
    """A file open for reading, local or remote (read by ranges, never copied
    whole); FileNotFoundError when absent."""
    if not is_remote(path):
        return open(path, "rb")
    fs, inner = filesystem(path)
    # Each read fetches at most READ_AHEAD more than it asks (s3fs's default is
    # 50 MiB, too much for a Parquet reader seeking from column to column). The
    # cache is named: gcsfs's default ("adaptive", 2026.10) prefetches up to
    # 128 MiB in background tasks, which also outlive a file left unclosed.
    return fs.open(inner, "rb", block_size=READ_AHEAD, cache_type="readahead")


def open_parquet(path: str):
    """`pyarrow.parquet.ParquetFile` of a local or remote file."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(open_read(path) if is_remote(path) else path)


def _entries(directory: str, kind: str) -> list[dict[str, Any]]:
    """fsspec's entries of type `kind` ("file", "directory") directly in `directory`."""
    fs, inner = filesystem(directory)
    try:
        found = fs.ls(inner.rstrip("/"), detail=True)
    except FileNotFoundError:
        return []
    return [entry for entry in found if entry["type"] == kind and entry["name"].rstrip("/") != inner.rstrip("/")]


def list_files(directory: str) -> list[tuple[str, int]]:
    """(name, size) of the plain files directly in `directory`."""
    return sorted((e["name"].rsplit("/", 1)[1], e["size"]) for e in _entries(directory, "file"))


def list_dirs(directory: str) -> list[str]:
    """Names of the directories directly in `directory` (on an object store:
    the first path parts of the objects under the prefix)."""
    return sorted(e["name"].rstrip("/").rsplit("/", 1)[1] for e in _entries(directory, "directory"))


def dir_exists(path: str) -> bool:
    """A directory (on an object store: a prefix with at least one object under it)."""
    fs, inner = filesystem(path)
    return fs.isdir(inner)


def remove_tree(path: str) -> None:
    """Delete a directory with everything in it (on an object store: every object under the prefix)."""
    fs, inner = filesystem(path)
    fs.rm(inner.rstrip("/"), recursive=True)


def match_files(pattern: str) -> list[str]:
    """The files a glob pattern matches, local or remote, sorted (local ones as
    the OS's glob names them, not as file:// URLs)."""
    if not is_remote(pattern):
        import glob

        return sorted(glob.glob(pattern))
    fs, inner = filesystem(pattern)
    return sorted(fs.unstrip_protocol(found) for found in fs.glob(inner))


def make_dirs(path: str) -> None:
    """A local directory and its parents (an object store has no directories: nothing to make)."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def replace_file(source: str, target: str) -> None:
    """Move `source` over `target`: atomic on a local disk (a rename); on an
    object store a copy then a delete (readers see the old object or the whole new one)."""
    fs, inner = filesystem(source)
    if not is_remote(source):
        fs.mv(inner, filesystem(target)[1])
        return
    # A copy then a delete, asked as such: gcsfs's `mv` first tries GCS's moveTo,
    # which a store without it (the GCS emulators) fails only after gcsfs's retries
    # (~20 s a file: a crawl's three crawl-db replacements took 67 s).
    fs.copy(inner, filesystem(target)[1])
    fs.rm_file(inner)


def remove_file(path: str) -> None:
    """Delete one file; FileNotFoundError when it is absent (on a store that says so)."""
    fs, inner = filesystem(path)
    fs.rm_file(inner)


def file_size(path: str) -> int | None:
    """Bytes of a file; None when it is absent."""
    fs, inner = filesystem(path)
    try:
        return fs.size(inner)
    except FileNotFoundError:
        return None


def sha256_file(path: str, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open_read(path) as fh:
        while chunk := fh.read(block):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path: str, data: bytes, exclusive: bool = False) -> None:
    """Write via a temporary file in the same directory and an atomic rename (an
    object store writes a whole object atomically by itself). `exclusive`
    (local files): hard-link instead of rename, so that only one writer can
    create `path`; the others get FileExistsError (on an object store,
    `ConditionalObject` is the exclusive create). A local file gets the mode
    the umask gives a new file, as the segment files Beam and pyarrow write do
    (mkstemp's 0600 would hide CURRENT and the manifests from a server running
    as another user)."""
    if is_remote(path):
        fs, inner = filesystem(path)
        fs.pipe_file(inner, data)
        return
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0666 less the umask
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if exclusive:
            os.link(tmp, path)  # fails if path exists
        else:
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class ConditionalObject:
    """One object written and deleted under its store's preconditions: the
    compare-and-swap of the index lease (ritrag/lease.py). `put(data, None)`
    creates it only if absent, `put(data, v)` and `delete(v)` act only while it
    is still at version `v` (an S3 ETag, a GCS generation), `read` gives the
    bytes with their version (FileNotFoundError when absent). A refused
    precondition: `put` returns None, `delete` False.

    fsspec's API has the exclusive create, but neither the version a write
    made nor a replace or delete at a version: so each is the store's own
    request, sent through the client of s3fs (`_call_s3`) or gcsfs (`call`)
    with this layer's endpoint and credentials (docs/OPERATING.md: each
    request per store). Other stores get None from `of`."""

    def __init__(self, path: str):
        self.path = path
        self.fs, inner = filesystem(path)
        self.bucket, self.key = inner.split("/", 1)

    @staticmethod
    def of(path: str) -> "_S3Object | _GcsObject | None":
        """The object at `path`, or None where this layer has no preconditions
        for its store (local paths have their own exclusive create, write_atomic)."""
        kind = {"s3": _S3Object, "s3a": _S3Object, "gs": _GcsObject, "gcs": _GcsObject}.get(
            path.split("://", 1)[0]) if is_remote(path) else None
        return kind(path) if kind else None

class _S3Object(ConditionalObject):
    def read(self) -> tuple[bytes, str]:
        from fsspec.asyn import sync

        async def get() -> tuple[bytes, str]:  # one request: the body and the ETag it has
            found = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self.key)
            try:
                return await found["Body"].read(), found["ETag"]
            finally:
                found["Body"].close()

        return sync(self.fs.loop, get)  # s3fs turns NoSuchKey into FileNotFoundError

    def put(self, data: bytes, version: str | None) -> str | None:
        condition = {"IfMatch": version} if version else {"IfNoneMatch": "*"}
        try:
            return self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=data, **condition)["ETag"]
        except OSError as exc:
            if _refused_on_s3(exc):
                return None
            raise

    def delete(self, version: str | None) -> bool:
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key,
                            **({"IfMatch": version} if version else {}))
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) or _refused_on_s3(exc):
                return False
            raise
        return True


def _refused_on_s3(exc: OSError) -> bool:
    """Whether s3fs's error is a refused precondition: 412, or 409
    ConditionalRequestConflict (another conditional write of the key is in flight)."""
    response = getattr(exc.__cause__, "response", None) or {}
    return response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412)


class _GcsObject(ConditionalObject):
    """gcsfs raises FileExistsError for every 412, the status of a refused precondition."""

    def read(self) -> tuple[bytes, str]:
        try:
            generation = self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key, json_out=True)["generation"]
            _, data = self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key, alt="media",
                                   ifGenerationMatch=generation)
        except FileExistsError:  # replaced between the two requests
            raise FileNotFoundError(self.path) from None
        return data, str(generation)

    def put(self, data: bytes, version: str | None) -> str | None:
        # A multipart upload, as gcsfs and Google's client send a small object
        # (fake-gcs-server checks the precondition of no other kind).
        upload = self.fs.base.replace("/storage/v1/", "/upload/storage/v1/") + "b/{}/o"
        boundary = secrets.token_hex(16).encode()  # a line no object of the layer holds
        body = b"\r\n".join([b"--" + boundary, b"Content-Type: application/json", b"",
                              json.dumps({"name": self.key}).encode(), b"--" + boundary,
                              b"Content-Type: application/octet-stream", b"", data, b"--" + boundary + b"--"])
        try:
            written = self.fs.call("POST", upload, self.bucket, uploadType="multipart", ifGenerationMatch=version or "0",
                                   headers={"Content-Type": f"multipart/related; boundary={boundary.decode()}"},
                                   data=body, json_out=True)
        except FileExistsError:
            return None
        return str(written["generation"])

    def delete(self, version: str | None) -> bool:
        try:
            self.fs.call("DELETE", "b/{}/o/{}", self.bucket, self.key, ifGenerationMatch=version)
        except (FileNotFoundError, FileExistsError):
            return False
        return True
