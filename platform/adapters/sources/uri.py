"""Adapter references: where an adapter's files live, as a URI.

``s3://bucket/prefix/`` (any S3-compatible store), ``file:///abs/path`` (a folder on this machine or
a shared mount) and ``hf://org/repo[@revision]`` (the Hugging Face hub, through its local cache).
The folder must hold exactly the files an uploaded archive may hold (checked by ``check_files``).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from loraplex.platform.adapters.archive import OPTIONAL_FILES, PICKLE_SUFFIXES, REQUIRED_FILES
from loraplex.platform.errors import BadRequest

SCHEMES = ("s3", "file", "hf")
MAX_URI_CHARS = 1024
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,95}/[A-Za-z0-9][A-Za-z0-9._\-]{0,95}$")
_HF_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/]{0,127}$")


REF_SEPARATOR = "#sha256="  # between an adapter reference's source and content hash


@dataclass(frozen=True)
class AdapterReference:
    """An adapter registered by reference: where its files are (``s3://``, ``hf://``, ``file://``)
    and the content registered (a store that now holds other content is refused). ``str()`` is the
    wire form the control plane hands replicas: ``<source>#sha256=<hash>``."""

    source: str
    sha256: str

    def __str__(self) -> str:
        return f"{self.source}{REF_SEPARATOR}{self.sha256}"

    @classmethod
    def parse(cls, text: str) -> AdapterReference | None:
        """The reference ``text`` names, or None for a plain local path."""
        source, sep, sha = text.partition(REF_SEPARATOR)
        return cls(source, sha) if sep and "://" in source else None


class SourceRejected(BadRequest):
    code = "invalid_source"


@dataclass(frozen=True)
class SourceURI:
    scheme: str  # "s3" | "file" | "hf"
    location: str  # bucket (s3), absolute folder (file), org/repo (hf)
    prefix: str = ""  # key prefix ending in "/" or empty (s3)
    revision: str | None = None  # hf only

    def __str__(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.location}/{self.prefix}"
        if self.scheme == "file":
            return f"file://{self.location}"
        return f"hf://{self.location}" + (f"@{self.revision}" if self.revision else "")


def parse_source(uri: str, param: str = "source") -> SourceURI:
    """Parse and normalise ``uri``; a bare absolute path means ``file://`` (vLLM's ``lora_path``)."""
    if not isinstance(uri, str) or not uri or len(uri) > MAX_URI_CHARS:
        raise SourceRejected(f"source must be a URI of at most {MAX_URI_CHARS} characters", param=param)
    if "\x00" in uri or any(ord(c) < 32 for c in uri):
        raise SourceRejected("source contains control characters", param=param)
    if uri.startswith("/"):
        uri = "file://" + uri
    parts = urlsplit(uri)
    if parts.scheme not in SCHEMES:
        raise SourceRejected(
            f"unsupported source {uri!r}: use s3://bucket/prefix/, file:///abs/path or hf://org/repo[@revision]",
            param=param,
        )
    if parts.query or parts.fragment:
        raise SourceRejected("source must not carry a query or fragment", param=param)
    if parts.scheme == "s3":
        bucket, prefix = parts.netloc, unquote(parts.path.lstrip("/"))
        if not _BUCKET.match(bucket):
            raise SourceRejected(f"invalid bucket name {bucket!r}", param=param)
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        if ".." in prefix.split("/") or "//" in prefix:
            raise SourceRejected("the key prefix must not contain '..' or empty segments", param=param)
        return SourceURI("s3", bucket, prefix)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise SourceRejected("file:// sources name a local folder: file:///abs/path", param=param)
        path = unquote(parts.path)
        if not path.startswith("/") or ".." in path.split("/"):
            raise SourceRejected("file:// sources need an absolute path without '..'", param=param)
        return SourceURI("file", posixpath.normpath(path))
    # hf://org/repo[@revision]
    repo, _, revision = (parts.netloc + parts.path).partition("@")
    repo = repo.rstrip("/")
    if not _HF_REPO.match(repo) or ".." in repo:
        raise SourceRejected(f"invalid hub repository {repo!r}: expected hf://org/repo[@revision]", param=param)
    if revision and (not _HF_REVISION.match(revision) or ".." in revision):
        raise SourceRejected(f"invalid hub revision {revision!r}", param=param)
    return SourceURI("hf", repo, revision=revision or None)


@dataclass(frozen=True)
class RemoteFile:
    name: str  # bare file name inside the adapter folder
    size: int
    etag: str  # S3 ETag, file mtime+size, or hub commit: what changes when the object changes


def check_files(files: list[RemoteFile], *, max_members: int, max_bytes: int, where: str) -> list[RemoteFile]:
    """The same rules as an uploaded archive: only the adapter files (no pickles, no sub-folders),
    a bounded count and size. Raises ``SourceRejected``; returns the files to fetch."""
    if len(files) > max_members:
        raise SourceRejected(f"{where} holds more than {max_members} files", param="source", code="too_many_members")
    total = 0
    seen: set[str] = set()
    for f in files:
        base = posixpath.basename(f.name)
        if base.lower().endswith(PICKLE_SUFFIXES):
            raise SourceRejected(
                f"{f.name!r} is a pickle checkpoint; pickles are refused, ship adapter_model.safetensors",
                param="source",
                code="pickle_refused",
            )
        if "/" in f.name or base not in REQUIRED_FILES + OPTIONAL_FILES:
            raise SourceRejected(
                f"unexpected file {f.name!r} in {where}; expected {', '.join(REQUIRED_FILES)}"
                f" (optional: {', '.join(OPTIONAL_FILES)})",
                param="source",
            )
        if f.size < 0:
            raise SourceRejected(f"{f.name!r} has an invalid size", param="source")
        total += f.size
        if total > max_bytes:
            raise SourceRejected(f"{where} holds more than {max_bytes} bytes", param="source", code="too_large")
        seen.add(base)
    missing = [n for n in REQUIRED_FILES if n not in seen]
    if missing:
        raise SourceRejected(f"{where} lacks {', '.join(missing)}", param="source")
    return sorted(files, key=lambda f: f.name)
