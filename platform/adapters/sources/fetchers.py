"""One fetcher per source kind: list the adapter's files (names, sizes, a change tag), then copy
them into a local folder. Each copy is bounded by the listed size, so a store that lies about a
size, or an object that grows between listing and download, cannot fill the disk."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO, Any, Protocol

from loraplex.platform.adapters.sources.uri import RemoteFile, SourceRejected, SourceURI
from loraplex.platform.errors import ServiceUnavailable

CHUNK = 1 << 20
MAX_LISTED = 1000  # far above any adapter's file count


class StoreUnavailable(ServiceUnavailable):
    """The store could not be reached or answered with an error that may pass (retry later)."""

    code = "source_unavailable"


class SourceNotFound(SourceRejected):
    code = "source_not_found"


class Fetcher(Protocol):
    def list(self, src: SourceURI) -> list[RemoteFile]: ...

    def download(self, src: SourceURI, f: RemoteFile, dest: Path) -> None: ...


def copy_bounded(src: IO[bytes], dest: Path, limit: int, what: str) -> None:
    written = 0
    with open(dest, "xb") as out:
        while chunk := src.read(CHUNK):
            written += len(chunk)
            if written > limit:
                raise SourceRejected(f"{what} is larger than its listed size ({limit} bytes)", param="source")
            out.write(chunk)
    if written != limit:
        raise StoreUnavailable(f"{what} ended after {written} of {limit} bytes (changed while downloading?)")


class S3Fetcher:
    """boto3 against AWS or any S3-compatible store; credentials and endpoint from the standard
    AWS variables unless ``[adapters]`` names an endpoint. Short timeouts and few retries, so a
    store that is down answers within ``fetch_timeout_s``."""

    def __init__(self, endpoint_url: str, region: str, connect_timeout_s: float, read_timeout_s: float, attempts: int):
        self._kwargs = dict(endpoint_url=endpoint_url or None, region_name=region or None)
        self._timeouts = (connect_timeout_s, read_timeout_s, attempts)
        self._client: Any = None

    def _s3(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            connect, read, attempts = self._timeouts
            config = Config(
                connect_timeout=connect,
                read_timeout=read,
                retries={"max_attempts": attempts, "mode": "standard"},
                max_pool_connections=16,
            )
            self._client = boto3.session.Session().client("s3", config=config, **self._kwargs)
        return self._client

    def list(self, src: SourceURI) -> list[RemoteFile]:
        files: list[RemoteFile] = []
        with _store_errors(src):
            pages = self._s3().get_paginator("list_objects_v2").paginate(Bucket=src.location, Prefix=src.prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    name = obj["Key"][len(src.prefix) :]
                    if not name or name.endswith("/"):
                        continue  # "folder" marker objects
                    files.append(RemoteFile(name, int(obj["Size"]), str(obj.get("ETag", "")).strip('"')))
                if len(files) > MAX_LISTED:
                    break  # check_files refuses it anyway; do not page through a huge prefix
        if not files:
            raise SourceNotFound(f"no objects under {src}", param="source")
        return files

    def download(self, src: SourceURI, f: RemoteFile, dest: Path) -> None:
        with _store_errors(src):
            # IfMatch: the bytes are those of the listed version, or the store says it changed.
            obj = self._s3().get_object(Bucket=src.location, Key=src.prefix + f.name, IfMatch=f.etag)
            body = obj["Body"]
            try:
                copy_bounded(body, dest, f.size, f"{src}{f.name}")
            finally:
                body.close()


class _store_errors:
    """botocore's failures as platform errors: the caller's fault (400) or the store's (503)."""

    def __init__(self, src: SourceURI) -> None:
        self.src = src

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> None:
        if exc is None or not isinstance(exc, Exception):
            return
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchBucket", "NoSuchKey", "404"):
                raise SourceNotFound(f"{self.src}: {code}", param="source") from None
            if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise SourceRejected(f"{self.src}: access denied ({code})", param="source") from None
            if code in ("PreconditionFailed", "412"):
                raise StoreUnavailable(f"{self.src} changed while it was downloaded; try again") from None
            raise StoreUnavailable(f"{self.src}: the store answered {code or 'an error'}") from None
        if isinstance(exc, BotoCoreError):
            raise StoreUnavailable(f"{self.src}: the store is unreachable ({type(exc).__name__})") from None
        if isinstance(exc, OSError):
            raise StoreUnavailable(f"{self.src}: {exc}") from None


class FileFetcher:
    """A local or mounted folder. Only regular files directly inside it; links are refused (a link
    could point anywhere on the server)."""

    def __init__(self, allowed_roots: list[str]) -> None:
        self.allowed_roots = [os.path.normpath(r) for r in allowed_roots]

    def _folder(self, src: SourceURI) -> Path:
        path = src.location
        if self.allowed_roots and not any(
            path == r or path.startswith(r.rstrip("/") + "/") for r in self.allowed_roots
        ):
            raise SourceRejected(f"{src} is outside the allowed folders ([adapters] file_roots)", param="source")
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise SourceNotFound(f"{src} does not exist", param="source") from None
        except OSError as exc:
            raise StoreUnavailable(f"{src}: {exc}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise SourceRejected(f"{src} is not a folder", param="source")
        return Path(path)

    def list(self, src: SourceURI) -> list[RemoteFile]:
        return list_folder(self._folder(src), follow_links_within=None)

    def download(self, src: SourceURI, f: RemoteFile, dest: Path) -> None:
        open_regular_copy(self._folder(src) / f.name, dest, f.size, str(src), follow_links_within=None)


def list_folder(folder: Path, follow_links_within: Path | None) -> list[RemoteFile]:
    files = []
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        raise StoreUnavailable(f"{folder}: {exc}") from None
    for entry in entries[: MAX_LISTED + 1]:
        st = _regular_stat(Path(entry.path), follow_links_within, entry.name)
        if st is None:
            continue  # a sub-folder: reported by check_files only if it holds a file we need
        files.append(RemoteFile(entry.name, st.st_size, f"{st.st_mtime_ns}-{st.st_size}-{st.st_ino}"))
    if not files:
        raise SourceNotFound(f"{folder} holds no files", param="source")
    return files


def _regular_stat(path: Path, follow_links_within: Path | None, name: str) -> os.stat_result | None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if follow_links_within is None:
            raise SourceRejected(f"{name!r} is a link; links are not allowed", param="source")
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(follow_links_within):
            raise SourceRejected(f"{name!r} links outside the hub cache", param="source")
        st = os.stat(real)
    if stat.S_ISDIR(st.st_mode):
        raise SourceRejected(f"unexpected folder {name!r}; the adapter files must sit directly inside", param="source")
    if not stat.S_ISREG(st.st_mode):
        raise SourceRejected(f"{name!r} is not a regular file", param="source")
    return st


def open_regular_copy(path: Path, dest: Path, size: int, where: str, follow_links_within: Path | None) -> None:
    _regular_stat(path, follow_links_within, path.name)
    flags = os.O_RDONLY | (0 if follow_links_within is not None else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise StoreUnavailable(f"{where}/{path.name}: {exc}") from None
    with os.fdopen(fd, "rb") as src:
        copy_bounded(src, dest, size, f"{where}/{path.name}")


class HubFetcher:
    """``hf://org/repo[@revision]`` through huggingface_hub's own cache. Offline (HF_HUB_OFFLINE or
    no network) only what is already cached resolves; anything else is a clear 503."""

    def __init__(self, cache_dir: str, offline: bool) -> None:
        self.cache_dir = cache_dir or None
        self.offline = offline

    def _snapshot(self, src: SourceURI) -> tuple[Path, str]:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

        offline = self.offline or constants.HF_HUB_OFFLINE
        try:
            path = snapshot_download(
                src.location,
                revision=src.revision,
                cache_dir=self.cache_dir,
                local_files_only=offline,
                allow_patterns=["*.json", "*.safetensors", "*.md", "*.bin", "*.pt", "*.pth", "*.pkl", "*.ckpt"],
            )
        except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
            raise SourceNotFound(f"{src}: {type(exc).__name__}", param="source") from None
        except LocalEntryNotFoundError:
            raise StoreUnavailable(
                f"{src} is not in the local Hugging Face cache and the hub is "
                + ("disabled (offline mode)" if offline else "unreachable")
            ) from None
        except Exception as exc:  # noqa: BLE001 - network errors of every kind
            raise StoreUnavailable(f"{src}: the hub is unreachable ({type(exc).__name__})") from None
        return Path(path), Path(path).name  # the snapshot folder is named by the commit

    def list(self, src: SourceURI) -> list[RemoteFile]:
        folder, commit = self._snapshot(src)
        cache_root = folder.parent.parent  # models--org--repo: snapshots link into its blobs/
        files = list_folder(folder, follow_links_within=cache_root.resolve())
        return [RemoteFile(f.name, f.size, f"{commit}:{f.etag}") for f in files]

    def download(self, src: SourceURI, f: RemoteFile, dest: Path) -> None:
        folder, _ = self._snapshot(src)
        open_regular_copy(folder / f.name, dest, f.size, str(src), follow_links_within=folder.parent.parent.resolve())
