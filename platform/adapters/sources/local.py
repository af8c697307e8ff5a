"""``file://`` sources: a folder on this machine or a mount, under an allowed root.

Every path component below the root is opened with ``O_NOFOLLOW`` relative to its parent's file
descriptor (an ``openat`` walk), and the files are listed, checked and opened through the folder's
descriptor: a symbolic link anywhere in the path (a middle folder, the folder itself, a file) is
refused, whenever it appeared (at registration, or swapped in before a later fetch), and there is
no window between a check and the open in which a link could be put in place. ``..`` never
reaches here (``uri.parse_source`` refuses it). The roots themselves are the operator's and are
resolved once (a root may sit behind a link, e.g. a mount point)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loraplex.platform.adapters.sources.fetchers import MAX_LISTED, SourceNotFound, StoreUnavailable, copy_bounded
from loraplex.platform.adapters.sources.uri import RemoteFile, SourceRejected, SourceURI

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


class LinkRefused(SourceRejected):
    code = "link_refused"


class FileFetcher:
    """A local or mounted folder under one of ``allowed_roots``. Only regular files directly inside
    it; a link anywhere below the root is refused (it could point anywhere on the server)."""

    def __init__(self, allowed_roots: list[str]) -> None:
        if not allowed_roots:
            raise ValueError("file:// sources need at least one allowed root")
        # (as written, resolved): a source may name the root as configured or as it resolves
        self.roots = [(os.path.normpath(r), os.path.realpath(r)) for r in allowed_roots]

    def _below_root(self, src: SourceURI) -> tuple[str, list[str]]:
        path = os.path.normpath(src.location)
        for written, real in self.roots:
            for root in (written, real):
                if path == root or path.startswith(root.rstrip("/") + "/"):
                    rest = path[len(root) :].strip("/")
                    return real, [p for p in rest.split("/") if p]
        allowed = ", ".join(w for w, _ in self.roots)
        raise SourceRejected(f"{src} is outside the allowed folders ({allowed}; [adapters] file_roots)", param="source")

    @contextmanager
    def _folder(self, src: SourceURI) -> Iterator[int]:
        """The adapter folder as an open descriptor, reached without following any link."""
        root, parts = self._below_root(src)
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise StoreUnavailable(f"{src}: the allowed folder {root} cannot be opened ({exc.strerror})") from None
        try:
            for i, part in enumerate(parts):
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise _walk_error(src, "/".join(parts[: i + 1]), exc, fd, part) from None
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def list(self, src: SourceURI, deadline: float | None = None) -> list[RemoteFile]:
        files = []
        with self._folder(src) as fd:
            with os.scandir(fd) as entries:
                for n, entry in enumerate(entries):
                    if n > MAX_LISTED:
                        break
                    st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                    _check_regular(entry.name, st)
                    files.append(RemoteFile(entry.name, st.st_size, f"{st.st_mtime_ns}-{st.st_size}-{st.st_ino}"))
        if not files:
            raise SourceNotFound(f"{src} holds no files", param="source")
        return files

    def download(self, src: SourceURI, f: RemoteFile, dest: Path, deadline: float | None = None) -> None:
        with self._folder(src) as dir_fd:
            try:
                fd = os.open(f.name, _FILE_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                raise _walk_error(src, f.name, exc, dir_fd, f.name) from None
            with os.fdopen(fd, "rb") as handle:
                _check_regular(f.name, os.fstat(fd))  # what was opened, not what a name points at now
                os.set_blocking(fd, True)
                copy_bounded(handle, dest, f.size, f"{src}/{f.name}", deadline)


def _check_regular(name: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise LinkRefused(f"{name!r} is a link; links are not allowed in file:// sources", param="source")
    if stat.S_ISDIR(st.st_mode):
        raise SourceRejected(f"unexpected folder {name!r}; the adapter files must sit directly inside", param="source")
    if not stat.S_ISREG(st.st_mode):
        raise SourceRejected(f"{name!r} is not a regular file", param="source")


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _walk_error(src: SourceURI, where: str, exc: OSError, dir_fd: int, name: str) -> Exception:
    # O_NOFOLLOW met a link: ELOOP (BSD: EMLINK); with O_DIRECTORY Linux says ENOTDIR instead
    if exc.errno in (errno.ELOOP, errno.EMLINK) or (exc.errno == errno.ENOTDIR and _is_link(dir_fd, name)):
        return LinkRefused(
            f"{src}: {where!r} is a link; links are not allowed anywhere in a file:// path", param="source"
        )
    if exc.errno == errno.ENOTDIR:
        return SourceRejected(f"{src}: {where!r} is not a folder", param="source")
    if exc.errno == errno.ENOENT:
        return SourceNotFound(f"{src} does not exist", param="source")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return SourceRejected(f"{src}: {where!r} is not readable by the server", param="source")
    return StoreUnavailable(f"{src}: {where!r}: {exc.strerror}")
