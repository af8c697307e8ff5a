"""Safe unpacking of an uploaded adapter archive (.zip or .tar.gz, recognised by content).

Refuses, before writing anything: absolute paths, ``..``, links and devices, too many members,
too many unpacked bytes (declared and actual), unexpected files and pickle weights. The archive may
hold the files at its root or inside one top-level folder.
"""

from __future__ import annotations

import posixpath
import stat
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from loraplex.platform.errors import BadRequest, PayloadTooLarge

REQUIRED_FILES = ("adapter_config.json", "adapter_model.safetensors")
OPTIONAL_FILES = ("README.md",)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
CHUNK = 1 << 20


class UploadRejected(BadRequest):
    code = "invalid_upload"


class UploadTooLarge(PayloadTooLarge):
    pass


@dataclass(frozen=True)
class ArchiveLimits:
    max_members: int
    max_unpacked_bytes: int


@dataclass(frozen=True)
class _Member:
    name: str  # path inside the archive, normalised
    size: int  # declared uncompressed size
    handle: zipfile.ZipInfo | tarfile.TarInfo


# Opens one member for reading (the archive's own kind of member handle).
_Reader = Callable[[_Member], AbstractContextManager[IO[bytes]]]


def extract_adapter_archive(archive: Path, dest: Path, limits: ArchiveLimits) -> None:
    """Unpack the adapter files of ``archive`` into ``dest`` (flat), or raise ``UploadRejected``."""
    if archive.stat().st_size == 0:
        raise UploadRejected("the uploaded file is empty", param="file")
    with _open(archive) as (members, reader):
        files = _plan(members, limits)
        written = 0
        for target, member in files.items():
            with reader(member) as src, open(dest / target, "xb") as out:
                while chunk := src.read(CHUNK):
                    written += len(chunk)
                    if written > limits.max_unpacked_bytes:
                        raise UploadTooLarge(
                            f"archive unpacks to more than {limits.max_unpacked_bytes} bytes",
                            param="file",
                        )
                    out.write(chunk)


@contextmanager
def _open(archive: Path) -> Iterator[tuple[list[_Member], _Reader]]:
    with open(archive, "rb") as f:
        magic = f.read(4)
    if magic.startswith(b"PK\x03\x04") or magic.startswith(b"PK\x05\x06"):
        try:
            zf = zipfile.ZipFile(archive)
        except (zipfile.BadZipFile, OSError) as exc:
            raise UploadRejected(f"the .zip archive is corrupt: {exc}", param="file") from None
        with zf:
            yield [_zip_member(i) for i in zf.infolist()], lambda m: _guard(zf.open(cast(zipfile.ZipInfo, m.handle)))
        return
    if magic.startswith(b"\x1f\x8b"):
        try:
            tf = tarfile.open(archive, mode="r:gz")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise UploadRejected(f"the .tar.gz archive is corrupt: {exc}", param="file") from None
        with tf:
            try:
                infos = _tar_members(tf)
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise UploadRejected(f"the .tar.gz archive is corrupt: {exc}", param="file") from None
            yield infos, lambda m: _guard(tf.extractfile(cast(tarfile.TarInfo, m.handle)))
        return
    raise UploadRejected("the upload is not a .zip or .tar.gz archive", param="file")


def _tar_members(tf: tarfile.TarFile) -> list[_Member]:
    members = []
    for info in tf:
        if info.issym() or info.islnk():
            raise UploadRejected(f"archive member {info.name!r} is a link; links are not allowed", param="file")
        if not (info.isreg() or info.isdir()):
            raise UploadRejected(f"archive member {info.name!r} is not a regular file", param="file")
        members.append(_Member(info.name + ("/" if info.isdir() else ""), info.size, info))
        if len(members) > 10_000:
            break
    return members


def _zip_member(info: zipfile.ZipInfo) -> _Member:
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise UploadRejected(f"archive member {info.filename!r} is a link; links are not allowed", param="file")
    kind = stat.S_IFMT(mode)  # 0 when the archiver recorded no Unix file type
    if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
        raise UploadRejected(f"archive member {info.filename!r} is not a regular file", param="file")
    return _Member(info.filename, info.file_size, info)


@contextmanager
def _guard(handle: IO[bytes] | None) -> Iterator[IO[bytes]]:
    if handle is None:
        raise UploadRejected("an archive member could not be read", param="file")
    try:
        yield handle
    except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError) as exc:
        raise UploadRejected(f"the archive is corrupt: {exc}", param="file") from None
    finally:
        handle.close()


def _plan(members: list[_Member], limits: ArchiveLimits) -> dict[str, _Member]:
    if len(members) > limits.max_members:
        raise UploadRejected(
            f"archive has more than {limits.max_members} members", param="file", code="too_many_members"
        )
    files: list[tuple[str, _Member]] = []
    declared = 0
    for m in members:
        path = _safe_path(m.name)
        if m.name.endswith("/"):
            continue
        declared += m.size
        if declared > limits.max_unpacked_bytes:
            raise UploadTooLarge(f"archive unpacks to more than {limits.max_unpacked_bytes} bytes", param="file")
        files.append((path, m))
    if not files:
        raise UploadRejected("the archive holds no files", param="file")
    return _flatten(files)


def _safe_path(name: str) -> str:
    if "\\" in name or "\x00" in name:
        raise UploadRejected(f"archive member {name!r} has an invalid path", param="file")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UploadRejected(f"archive member {name!r} has an absolute path", param="file")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UploadRejected(f"archive member {name!r} escapes the archive ('..')", param="file")
    return posixpath.join(*parts) if parts else ""


def _flatten(files: list[tuple[str, _Member]]) -> dict[str, _Member]:
    """Accept the files at the root or all inside one folder; map them to their bare names."""
    tops = {p.split("/", 1)[0] for p, _ in files if "/" in p}
    root_level = [p for p, _ in files if "/" not in p]
    if len(tops) == 1 and not root_level:
        top = tops.pop() + "/"
        files = [(p[len(top) :], m) for p, m in files]
    out: dict[str, _Member] = {}
    for path, m in files:
        base = posixpath.basename(path)
        if base.lower().endswith(PICKLE_SUFFIXES):
            raise UploadRejected(
                f"{path!r} is a pickle checkpoint; pickles are refused, ship adapter_model.safetensors",
                param="file",
                code="pickle_refused",
            )
        if "/" in path or base not in REQUIRED_FILES + OPTIONAL_FILES:
            raise UploadRejected(
                f"unexpected file {path!r} in the archive; expected {', '.join(REQUIRED_FILES)}"
                f" (optional: {', '.join(OPTIONAL_FILES)})",
                param="file",
            )
        if base in out:
            raise UploadRejected(f"{base!r} appears twice in the archive", param="file")
        out[base] = m
    missing = [f for f in REQUIRED_FILES if f not in out]
    if missing:
        raise UploadRejected(f"the archive lacks {', '.join(missing)}", param="file")
    return out
