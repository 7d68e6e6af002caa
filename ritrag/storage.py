"""The one storage layer: reads, writes, listing, deletes and the conditional
writes the index lease is made of, for local paths and object stores alike.
Jobs, index commands, the lease (ritrag/lease.py) and the server's mirror
(ritrag/serving/remote.py) all reach files through it.

A local path goes through the OS (atomic rename, exclusive hard link); a URL
(s3://, gs://, az://, memory://, any fsspec protocol) through fsspec, the
one library that covers local disk, S3 (s3fs), GCS (gcsfs) and Azure (adlfs)
with one API, that a server can import without Beam, and whose S3 and GCS
file systems carry the stores' conditional requests (`ConditionalObject`).
Beam's own file systems stay inside the pipelines, where Beam's sources and
sinks and the DoFns writing files on workers need them; Beam configures
those from the same options (ritrag.pipelines.launcher).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
from typing import Any, BinaryIO

READ_AHEAD = 4 << 20
# fsspec protocol -> the extra that installs its file system
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


class StoreUnavailableError(Exception):
    """The package of a URL's protocol is not installed, or the URL names no store."""


def is_remote(path: str) -> bool:
    """gs://, s3://, memory://...: reached through fsspec."""
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
    """The settings of `protocol`. A worker of a remote runner, where DoFns
    read the live index through this layer, never ran the job's
    `use_pipeline_options`: Beam's SDK harness hands the job's options to
    Beam's FileSystems there, and the layer takes them from it."""
    if _settings is None:
        beam = sys.modules.get("apache_beam.io.filesystems")
        options = getattr(beam.FileSystems, "_pipeline_options", None) if beam else None
        if options is not None:
            use_pipeline_options(options)
    return (_settings or {}).get(protocol, {})


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec file system, path in it) of `url`; StoreUnavailableError naming
    the pip command when the protocol's package is not installed."""
    protocol = url.split("://", 1)[0]
    extra = EXTRAS.get(protocol)
    hint = f"pip install 'ritrag[{extra}]'" if extra else "pip install fsspec and the package of that protocol"
    try:
        import fsspec
    except ImportError:
        raise StoreUnavailableError(f"{url} needs fsspec: {hint}") from None
    try:
        # No listing cache: Beam's sinks and other processes write the same
        # prefixes, and a cached listing would hide what they wrote.
        return fsspec.core.url_to_fs(url, use_listings_cache=False, **_store_settings(protocol))
    except ImportError as exc:
        raise StoreUnavailableError(f"{protocol}:// needs a package that is not installed ({exc}): {hint}") from None
    except ValueError as exc:
        raise StoreUnavailableError(f"{url}: {exc}") from None


def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    fs, inner = filesystem(path)
    return fs.exists(inner)


def open_read(path: str) -> BinaryIO:
    """A file open for reading, local or remote (read by ranges, never copied
    whole); FileNotFoundError when absent."""
    if not is_remote(path):
        return open(path, "rb")
    fs, inner = filesystem(path)
    # Each read fetches at most READ_AHEAD more than it asks (s3fs's default is
    # 50 MiB, too much for a Parquet reader seeking from column to column).
    return fs.open(inner, "rb", block_size=READ_AHEAD)


def open_parquet(path: str):
    """`pyarrow.parquet.ParquetFile` of a local or remote file."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(open_read(path) if is_remote(path) else path)


def _entries(directory: str, kind: str) -> list[dict[str, Any]]:
    """fsspec's entries of type `kind` ("file", "directory") directly in a remote `directory`."""
    fs, inner = filesystem(directory)
    try:
        found = fs.ls(inner.rstrip("/"), detail=True)
    except FileNotFoundError:
        return []
    return [entry for entry in found if entry["type"] == kind and entry["name"].rstrip("/") != inner.rstrip("/")]


def list_files(directory: str) -> list[tuple[str, int]]:
    """(name, size) of the plain files directly in `directory`."""
    if is_remote(directory):
        return sorted((e["name"].rsplit("/", 1)[1], e["size"]) for e in _entries(directory, "file"))
    if not os.path.isdir(directory):
        return []
    return sorted((n, os.path.getsize(os.path.join(directory, n))) for n in os.listdir(directory)
                  if os.path.isfile(os.path.join(directory, n)))


def list_dirs(directory: str) -> list[str]:
    """Names of the directories directly in `directory` (on an object store:
    the first path parts of the objects under the prefix)."""
    if is_remote(directory):
        return sorted(e["name"].rstrip("/").rsplit("/", 1)[1] for e in _entries(directory, "directory"))
    return sorted(n for n in os.listdir(directory) if os.path.isdir(os.path.join(directory, n))) \
        if os.path.isdir(directory) else []


def dir_exists(path: str) -> bool:
    """A directory (on an object store: a prefix with at least one object under it)."""
    if not is_remote(path):
        return os.path.isdir(path)
    fs, inner = filesystem(path)
    return fs.isdir(inner)


def remove_tree(path: str) -> None:
    """Delete a directory with everything in it (on an object store: every object under the prefix)."""
    if not is_remote(path):
        shutil.rmtree(path)
        return
    fs, inner = filesystem(path)
    fs.rm(inner.rstrip("/"), recursive=True)


def match_files(pattern: str) -> list[str]:
    """The files a glob pattern matches, local or remote, sorted."""
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
    """Move `source` over `target`: atomic on a local disk (rename); on an object
    store a copy then a delete (readers see the old object or the whole new one)."""
    if not is_remote(source):
        os.replace(source, target)
        return
    fs, inner = filesystem(source)
    fs.mv(inner, filesystem(target)[1])


def remove_file(path: str) -> None:
    """Delete one file; FileNotFoundError when it is absent (on a store that says so)."""
    if not is_remote(path):
        os.unlink(path)
        return
    fs, inner = filesystem(path)
    fs.rm_file(inner)


def file_size(path: str) -> int | None:
    """Bytes of a file; None when it is absent."""
    if not is_remote(path):
        return os.path.getsize(path) if os.path.exists(path) else None
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
    compare-and-swap the index lease is made of (ritrag/lease.py).
    `put(data, None)` creates it only if absent (S3 `If-None-Match: *`, GCS
    `ifGenerationMatch=0`); `put(data, v)` and `delete(v)` act only while the
    object is still at version `v` (S3 `If-Match: <ETag>`, GCS
    `ifGenerationMatch=<generation>`); `read` returns the bytes with the
    version they are. A refused precondition returns None / False.

    fsspec's own API names only the exclusive create (`mode="create"`), and
    neither the version a write made nor a replace or delete at a version; so
    each operation here is the store's own request, sent through the client
    of s3fs (`_call_s3`) or gcsfs (`call`) that this layer's other requests
    use, with the same endpoint and credentials. Other stores have no such
    preconditions here: `of` gives None, and the lease falls back on its
    read-back check (docs/OPERATING.md)."""

    def __init__(self, path: str):
        self.path = path
        self.fs, inner = filesystem(path)
        self.bucket, self.key = inner.split("/", 1)

    @staticmethod
    def of(path: str) -> "ConditionalObject | None":
        """The object at `path`, or None where this layer has no preconditions
        for its store (local paths have their own exclusive create, write_atomic)."""
        kind = {"s3": _S3Object, "s3a": _S3Object, "gs": _GcsObject, "gcs": _GcsObject}.get(
            path.split("://", 1)[0]) if is_remote(path) else None
        return kind(path) if kind else None

    def read(self) -> tuple[bytes, str]:
        """(the object's bytes, their version); FileNotFoundError when absent."""
        raise NotImplementedError

    def put(self, data: bytes, version: str | None) -> str | None:
        """The version written; None when the precondition was refused."""
        raise NotImplementedError

    def delete(self, version: str | None) -> bool:
        """Whether it was deleted; False when absent or the precondition was refused."""
        raise NotImplementedError


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
