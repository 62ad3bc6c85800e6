"""Files under the warehouse, through fsspec: local folders and object stores alike. Small reads,
listings and best-effort deletes; nothing here knows about Delta or sinks."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from typing import Any

log = logging.getLogger(__name__)


def fs_of(path: str):
    """(file system, path inside it) of a local path or URI. Object stores go through Arrow's own
    clients, credentials from each cloud's standard environment variables: S3
    (``s3://bucket/key``: AWS_*), ADLS (``abfss://container@account.dfs.core.windows.net/key`` or
    ``az://container/key``: AZURE_*, else Azure's default credential chain), GCS
    (``gs://bucket/key``: Google's Application Default Credentials)."""
    from reconcile import settings

    store = settings.store_of(path)
    if store == "s3":
        return _s3(settings.s3_endpoint(), settings.s3_region()), path.split("://", 1)[1]
    if store == "azure":
        account, key, _ = settings.azure_location(path)
        if not account:
            from reconcile.errors import SinkError

            raise SinkError(
                f"warehouse path {path} names no Azure storage account",
                remedy="write it as abfss://<container>@<account>.dfs.core.windows.net/<prefix> "
                "(or set AZURE_STORAGE_ACCOUNT_NAME for az://<container>/<prefix>).",
            )
        return _azure(account, settings.azure_endpoint(), _azure_credentials()), key
    if store == "gcs":
        return _gcs(), path.split("://", 1)[1]
    from fsspec.core import url_to_fs

    return url_to_fs(path)


@functools.lru_cache(maxsize=4)
def _s3(endpoint: str | None, region: str | None):
    import pyarrow.fs as pafs
    from fsspec.implementations.arrow import ArrowFSWrapper

    options: dict = {"region": region or "us-east-1"}
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        options.update(endpoint_override=host, scheme=scheme)
    return ArrowFSWrapper(pafs.S3FileSystem(**options))


def _azure_credentials() -> tuple[tuple[str, str], ...]:
    """Arrow's AzureFileSystem arguments from the standard Azure variables: the account key, a SAS
    token or a service principal; none of them: Azure's default credential chain (managed or
    workload identity, the Azure CLI). Held in this process only."""
    env = os.environ
    if env.get("AZURE_STORAGE_ACCOUNT_KEY"):
        return (("account_key", env["AZURE_STORAGE_ACCOUNT_KEY"]),)
    sas = env.get("AZURE_STORAGE_SAS_TOKEN") or env.get("AZURE_STORAGE_SAS_KEY")
    if sas:
        return (("sas_token", sas),)
    if all(env.get(k) for k in ("AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID")):
        return tuple(
            (k.lower().removeprefix("azure_"), env[k])
            for k in ("AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID")
        )
    return ()


@functools.lru_cache(maxsize=4)
def _azure(account: str, endpoint: str | None, credentials: tuple[tuple[str, str], ...]):
    import pyarrow.fs as pafs
    from fsspec.implementations.arrow import ArrowFSWrapper

    options: dict = dict(credentials)
    if endpoint:  # http://127.0.0.1:10000/<account> (path-style) or https://<account>.blob.<suffix>
        scheme, _, rest = endpoint.partition("://")
        host, _, prefix = rest.partition("/")
        if not prefix.strip("/") and host.startswith(f"{account}."):
            blob = host[len(account) :]  # Arrow puts the account before an authority that starts with "."
            dfs = blob.replace(".blob.", ".dfs.", 1)
        else:
            blob = dfs = host  # Arrow puts the account first in the path
        options.update(
            blob_storage_authority=blob,
            dfs_storage_authority=dfs,
            blob_storage_scheme=scheme,
            dfs_storage_scheme=scheme,
        )
    return ArrowFSWrapper(pafs.AzureFileSystem(account, **options))


@functools.lru_cache(maxsize=1)
def _gcs():
    import pyarrow.fs as pafs
    from fsspec.implementations.arrow import ArrowFSWrapper

    return ArrowFSWrapper(pafs.GcsFileSystem())


def read_text(path: str) -> str | None:
    """A small file's text (None if it does not exist)."""
    fs, p = fs_of(path)
    try:
        with fs.open(p, "rb") as f:
            return f.read().decode("utf-8")
    except FileNotFoundError:
        return None


def read_bytes(path: str) -> bytes:
    fs, p = fs_of(path)
    with fs.open(p, "rb") as f:
        return f.read()


def write_bytes(path: str, data: bytes) -> None:
    """Write a new file whole (an object store's one PUT)."""
    fs, p = fs_of(path)
    with fs.open(p, "wb") as f:
        f.write(data)


def make_empty_dir(path: str) -> None:
    """Create the directory ``path`` holding only Spark's marker of a finished write (``_SUCCESS``,
    which :func:`list_files` skips): the staged directory of a write that has no row to write."""
    fs, p = fs_of(path)
    fs.makedirs(p, exist_ok=True)
    write_bytes(f"{path.rstrip('/')}/_SUCCESS", b"")


def put_if_absent(path: str, data: bytes) -> bool:
    """Create the file ``path`` with ``data`` only if no file is there (False if one is): atomic
    on a local disk (a hard link of a finished temporary file), on S3 and Azure (a conditional
    PUT, ``If-None-Match: *``) and GCS (``ifGenerationMatch=0``), through obstore, the
    object-store client delta-rs is built on (credentials from the standard variables)."""
    from reconcile import settings

    store = settings.store_of(path)
    if store is None:
        return _link_new(path, data)
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    if store == "azure":
        account, within, _ = settings.azure_location(path)
        container, _, key = within.partition("/")
        client = _azure_store(account, container, settings.azure_endpoint())
    else:
        bucket, _, key = path.split("://", 1)[1].partition("/")
        client = (
            _s3_store(bucket, settings.s3_endpoint(), settings.s3_region()) if store == "s3" else _gcs_store(bucket)
        )
    try:
        obstore.put(client, key, data, mode="create")
    except (AlreadyExistsError, PreconditionError):
        return False
    return True


def _link_new(path: str, data: bytes) -> bool:
    local = path.removeprefix("file://")
    tmp = f"{os.path.dirname(local)}/.{os.path.basename(local)}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    with open(tmp, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, local)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


@functools.lru_cache(maxsize=4)
def _s3_store(bucket: str, endpoint: str | None, region: str | None):
    """obstore's S3 client for ``bucket`` (credentials from the standard AWS variables)."""
    from obstore.store import S3Store

    config: Any = {"region": region or "us-east-1"}
    client: Any = {}
    if endpoint:
        config.update(endpoint=endpoint, virtual_hosted_style_request=False)
        client["allow_http"] = endpoint.startswith("http://")
    return S3Store(bucket, config=config, client_options=client)


@functools.lru_cache(maxsize=4)
def _azure_store(account: str | None, container: str, endpoint: str | None):
    """obstore's Azure Blob client for ``container`` (credentials from the standard Azure
    variables; ``endpoint``: an emulator's, path-style)."""
    from obstore.store import AzureStore

    config: Any = {"account_name": account} if account else {}
    if endpoint:
        config["endpoint"] = endpoint
    return AzureStore(
        container, config=config, client_options={"allow_http": bool(endpoint and endpoint.startswith("http://"))}
    )


@functools.lru_cache(maxsize=4)
def _gcs_store(bucket: str):
    """obstore's GCS client for ``bucket`` (Application Default Credentials)."""
    from obstore.store import GCSStore

    return GCSStore(bucket)


def digest(path: str) -> str:
    """A file's content digest (sha256, hex)."""
    return hashlib.sha256(read_bytes(path)).hexdigest()


def _tree(fs, root: str) -> list[tuple[str, bool, int]]:
    """[(path relative to ``root``, is a directory, size)] of everything below ``root``: on an
    object store one flat listing (Arrow's recursive selector: a few requests per thousand keys,
    not one per directory as a directory walk makes); on a local disk a walk."""
    from fsspec.implementations.arrow import ArrowFSWrapper

    if isinstance(fs, ArrowFSWrapper):
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
        found = [(i.path, i.type == pafs.FileType.Directory, i.size or 0) for i in fs.fs.get_file_info(selector)]
    else:
        if not fs.exists(root):
            return []
        found = [
            (full, info.get("type") == "directory", int(info.get("size") or 0))
            for full, info in fs.find(root, detail=True, withdirs=True).items()
        ]
    prefix = root + "/"
    return [(full[len(prefix) :], d, size) for full, d, size in found if full.startswith(prefix)]


def list_files(path: str) -> dict[str, int]:
    """{relative path: size} of the data files below ``path`` (empty if it does not exist).

    A directory deleted while it is listed (another attempt's cleanup) is listed again; one
    that is gone is empty."""
    fs, root = fs_of(path)
    root = root.rstrip("/")
    for attempt in range(3):
        try:
            found = _tree(fs, root)
        except FileNotFoundError:
            if attempt == 2:
                raise
            continue
        return {
            rel: size for rel, is_dir, size in found if not is_dir and not rel.rsplit("/", 1)[-1].startswith(("_", "."))
        }
    return {}


def list_dirs(path: str) -> list[str]:
    """The names of the directories directly below ``path`` (empty if it does not exist)."""
    fs, root = fs_of(path)
    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        return []
    return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")


def list_subdirs(path: str) -> dict[str, list[str]]:
    """{directory directly below ``path``: the names of the directories directly below it}, from
    one listing (:func:`_tree`)."""
    fs, root = fs_of(path)
    root = root.rstrip("/")
    try:
        found = _tree(fs, root)
    except FileNotFoundError:
        return {}
    out: dict[str, list[str]] = {}
    for rel, is_dir, _ in found:
        if is_dir:
            top, _, sub = rel.partition("/")
            subs = out.setdefault(top, [])
            if sub and "/" not in sub:
                subs.append(sub)
    return {k: sorted(v) for k, v in sorted(out.items())}


def list_names(path: str) -> list[str]:
    """The names of the entries directly below ``path`` (empty if it does not exist)."""
    fs, root = fs_of(path)
    try:
        return [n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(root, detail=False)]
    except FileNotFoundError:
        return []


def path_exists(path: str) -> bool:
    fs, p = fs_of(path)
    return bool(fs.exists(p))


def delete_files(paths: list[str], chunk: int = 500) -> None:
    """Delete files (not directories): a list per call where the file system takes one, one by
    one through Arrow's object-store clients (S3, ADLS, GCS); a file already gone is not an
    error."""
    by_fs: dict[int, tuple[Any, list[str]]] = {}
    for path in paths:
        fs, p = fs_of(path)
        by_fs.setdefault(id(fs), (fs, []))[1].append(p)
    from fsspec.implementations.arrow import ArrowFSWrapper

    for fs, ps in by_fs.values():
        bulk = not isinstance(fs, ArrowFSWrapper)  # Arrow's stores take one path per call
        for i in range(0, len(ps), chunk):
            part = ps[i : i + chunk]
            if bulk:
                try:
                    fs.rm(part)
                    continue
                except FileNotFoundError:  # one of them went meanwhile: the rest one by one
                    pass
            for p in part:
                try:
                    fs.rm_file(p)
                except FileNotFoundError:
                    pass


def delete_path(path: str, attempts: int = 3) -> bool:
    """Delete a staged directory; False if it was not there or could not be emptied. Cleanup is
    best effort and never fails a task: an outdated attempt may still be writing files into the
    directory while it is removed (the listing is then not empty); what stays is deleted by the
    next cleanup."""
    fs, p = fs_of(path)
    for attempt in range(attempts):
        try:
            if not fs.exists(p):
                return False
            fs.rm(p, recursive=True)
            return True
        except FileNotFoundError:  # deleted meanwhile by another attempt's cleanup
            return False
        except OSError as exc:  # ENOTEMPTY: a zombie attempt wrote into it meanwhile
            if attempt == attempts - 1:
                log.warning("could not delete %s (%s): the next cleanup retries it", path, exc)
                return False
            time.sleep(0.2 * (attempt + 1))
    return False
