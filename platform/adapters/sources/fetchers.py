"""One fetcher per source kind: list the adapter's files (names, sizes, a change tag), then copy
them into a local folder. Each copy is bounded by the listed size, so a store that lies about a
size, or an object that grows between listing and download, cannot fill the disk; and by the
fetch's deadline, so a store that trickles bytes cannot hold a fetch slot forever. The kinds:
``s3.S3Fetcher``, ``local.FileFetcher`` and ``HubFetcher`` (here)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import IO, Protocol

from loraplex.platform.adapters.sources.uri import RemoteFile, SourceRejected, SourceURI
from loraplex.platform.errors import ServiceUnavailable

CHUNK = 1 << 20
MAX_LISTED = 1000  # far above any adapter's file count


class StoreUnavailable(ServiceUnavailable):
    """The store could not be reached or answered with an error that may pass (retry later)."""

    code = "source_unavailable"


class SourceNotFound(SourceRejected):
    code = "source_not_found"


class FetchDeadline(StoreUnavailable):
    """The whole fetch (listing and every file) took longer than ``[adapters] fetch_deadline_s``."""

    code = "source_timeout"


class Fetcher(Protocol):
    """``deadline``: a ``time.monotonic()`` instant after which the call gives up (FetchDeadline)."""

    def list(self, src: SourceURI, deadline: float | None = None) -> list[RemoteFile]: ...

    def download(self, src: SourceURI, f: RemoteFile, dest: Path, deadline: float | None = None) -> None: ...


def check_deadline(deadline: float | None, what: str) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise FetchDeadline(f"{what}: the store did not deliver within the fetch deadline; try again later")


def copy_bounded(src: IO[bytes], dest: Path, limit: int, what: str, deadline: float | None = None) -> None:
    written = 0
    with open(dest, "xb") as out:
        while chunk := src.read(CHUNK):
            check_deadline(deadline, what)
            written += len(chunk)
            if written > limit:
                raise SourceRejected(f"{what} is larger than its listed size ({limit} bytes)", param="source")
            out.write(chunk)
    if written != limit:
        raise StoreUnavailable(f"{what} ended after {written} of {limit} bytes (changed while downloading?)")


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


def open_regular_copy(
    path: Path, dest: Path, size: int, where: str, follow_links_within: Path | None, deadline: float | None = None
) -> None:
    _regular_stat(path, follow_links_within, path.name)
    flags = os.O_RDONLY | (0 if follow_links_within is not None else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise StoreUnavailable(f"{where}/{path.name}: {exc}") from None
    with os.fdopen(fd, "rb") as src:
        copy_bounded(src, dest, size, f"{where}/{path.name}", deadline)


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

    def list(self, src: SourceURI, deadline: float | None = None) -> list[RemoteFile]:
        folder, commit = self._snapshot(src)
        cache_root = folder.parent.parent  # models--org--repo: snapshots link into its blobs/
        files = list_folder(folder, follow_links_within=cache_root.resolve())
        return [RemoteFile(f.name, f.size, f"{commit}:{f.etag}") for f in files]

    def download(self, src: SourceURI, f: RemoteFile, dest: Path, deadline: float | None = None) -> None:
        folder, _ = self._snapshot(src)
        open_regular_copy(folder / f.name, dest, f.size, str(src), folder.parent.parent.resolve(), deadline)
