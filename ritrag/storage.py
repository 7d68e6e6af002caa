"""One file-access layer for local paths and object stores (gs://, s3://, any
Beam file system), shared by the jobs, the crawl, the index commands and the
server's loader: a remote path goes through Beam's FileSystems, configured from
the job's or command's own options (`use_pipeline_options`), a local one
through the OS. (The serving mirror of a remote index copies it through fsspec
instead, so that a server needs no Beam: serving/remote.py.)"""
from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import threading


def is_remote(path: str) -> bool:
    """gs://, s3://, hdfs://...: reached through Beam's FileSystems (jobs only)."""
    return "://" in path


# The pipeline options Beam's file systems and the lease's store clients were
# given (use_pipeline_options); None: each store's defaults (the AWS chain,
# Application Default Credentials).
_store_options = None


def use_pipeline_options(options) -> None:
    """Configure every object store a job or a command reaches (gs://, s3://,
    any Beam file system) from `options` (Beam `PipelineOptions`: S3Options'
    --s3_endpoint_url and keys, GoogleCloudOptions' --project, ...). Beam
    configures its file systems only when a Pipeline is constructed (and in its
    workers), but a job reads the index and takes its lease before that, and
    `ritrag versions`/`rollback`/`prune`/`inspect` build no pipeline at all: each
    calls this first. The options stay in force for the process, as Beam's do."""
    global _store_options
    _store_options = options
    remote_filesystems().set_options(options)  # and shares S3 clients (_share_s3_clients)


def remote_filesystems():
    from apache_beam.io.filesystems import FileSystems  # only the jobs write remote indexes

    _share_s3_clients()
    return FileSystems


# The S3 options Beam's boto3 wrapper reads (apache_beam/io/aws/clients/s3/boto3_client.py).
_S3_CLIENT_OPTIONS = ("s3_access_key_id", "s3_secret_access_key", "s3_session_token", "s3_endpoint_url",
                      "s3_disable_ssl", "s3_region_name", "s3_api_version", "s3_verify")
_s3_clients_lock = threading.Lock()


def _share_s3_clients() -> None:
    """Beam's S3 file system builds a new boto3 session and client for every
    call it makes (exists, open, match, delete, ...), and each costs about 0.2 s
    of CPU reloading botocore's service models: a job's few hundred calls spent
    minutes there. botocore clients are thread-safe, so the process keeps one
    per set of S3 options; each Beam wrapper still gets its own stream state,
    copied from a fresh wrapper of that set. Installed once, where this process
    first reaches Beam's file systems (workers of a remote runner that never
    call this pay Beam's own cost)."""
    try:
        from apache_beam.io.aws.clients.s3 import boto3_client
    except ImportError:  # no AWS extra: no S3 file system either
        return
    if getattr(boto3_client.Client, "shares_clients", False):
        return
    beam_client = boto3_client.Client
    fresh: dict[tuple, object] = {}

    class SharedS3Client(beam_client):
        shares_clients = True

        def __init__(self, options):
            key = _s3_options_key(options)
            with _s3_clients_lock:
                if key not in fresh:
                    fresh[key] = beam_client(options)
                self.__dict__.update(fresh[key].__dict__)

    boto3_client.Client = SharedS3Client


def _s3_options_key(options) -> tuple:
    if isinstance(options, dict):
        return tuple(options.get(name) for name in _S3_CLIENT_OPTIONS)
    from apache_beam.options.pipeline_options import S3Options

    s3 = options.view_as(S3Options)
    return tuple(getattr(s3, name, None) for name in _S3_CLIENT_OPTIONS)


def store_options():
    if _store_options is None:
        from apache_beam.options.pipeline_options import PipelineOptions

        return PipelineOptions([])
    return _store_options


def exists(path: str) -> bool:
    return remote_filesystems().exists(path) if is_remote(path) else os.path.exists(path)


def open_read(path: str):
    """A file open for reading, local or remote; FileNotFoundError when absent
    (each store raises its own error for a missing object, or none until the
    first read)."""
    if not is_remote(path):
        return open(path, "rb")
    if not remote_filesystems().exists(path):
        raise FileNotFoundError(path)
    return remote_filesystems().open(path)


def open_parquet(path: str):
    """`pyarrow.parquet.ParquetFile` of a local or remote file (remote: read by
    ranges through Beam's file system, never copied whole)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(open_read(path) if is_remote(path) else path)


def list_files(directory: str) -> list[tuple[str, int]]:
    """(name, size) of the plain files directly in `directory`."""
    if is_remote(directory):
        found = remote_filesystems().match([directory.rstrip("/") + "/*"])[0].metadata_list
        return sorted((m.path.rsplit("/", 1)[1], m.size_in_bytes) for m in found)
    if not os.path.isdir(directory):
        return []
    return sorted((n, os.path.getsize(os.path.join(directory, n))) for n in os.listdir(directory)
                  if os.path.isfile(os.path.join(directory, n)))


def list_dirs(directory: str) -> list[str]:
    """Names of the directories directly in `directory` (on an object store:
    the first path parts of the objects under the prefix)."""
    if not is_remote(directory):
        return sorted(n for n in os.listdir(directory) if os.path.isdir(os.path.join(directory, n))) \
            if os.path.isdir(directory) else []
    prefix = directory.rstrip("/") + "/"
    found = remote_filesystems().match([prefix + "**"])[0].metadata_list
    return sorted({m.path[len(prefix):].split("/", 1)[0] for m in found if "/" in m.path[len(prefix):]})


def dir_exists(path: str) -> bool:
    """A directory (on an object store: a prefix with at least one object under it)."""
    if not is_remote(path):
        return os.path.isdir(path)
    return bool(remote_filesystems().match([path.rstrip("/") + "/**"], limits=[1])[0].metadata_list)


def remove_tree(path: str) -> None:
    """Delete a directory with everything in it (on an object store: every object under the prefix)."""
    if is_remote(path):
        remote_filesystems().delete([path.rstrip("/") + "/"])
    else:
        shutil.rmtree(path)


def match_files(pattern: str) -> list[str]:
    """The files a glob pattern matches, local or remote, sorted."""
    if is_remote(pattern):
        return sorted(m.path for m in remote_filesystems().match([pattern])[0].metadata_list)
    import glob

    return sorted(glob.glob(pattern))


def make_dirs(path: str) -> None:
    """A local directory and its parents (an object store has no directories: nothing to make)."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def replace_file(source: str, target: str) -> None:
    """Move `source` over `target`: atomic on a local disk (rename); on an object
    store a copy then a delete (readers see the old object or the whole new one)."""
    if is_remote(source):
        remote_filesystems().rename([source], [target])
    else:
        os.replace(source, target)


def remove_file(path: str) -> None:
    if is_remote(path):
        remote_filesystems().delete([path])
    else:
        os.unlink(path)


def file_size(path: str) -> int | None:
    """Bytes of a file; None when it is absent."""
    if not is_remote(path):
        return os.path.getsize(path) if os.path.exists(path) else None
    found = remote_filesystems().match([path])[0].metadata_list
    return found[0].size_in_bytes if found else None


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
    create `path`; the others get FileExistsError. A local file gets the mode
    the umask gives a new file, as the segment files Beam and pyarrow write do
    (mkstemp's 0600 would hide CURRENT and the manifests from a server running
    as another user)."""
    if is_remote(path):
        with remote_filesystems().create(path) as fh:
            fh.write(data)
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
