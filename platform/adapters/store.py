"""Content-addressed adapter files: ``<root>/<sha[:2]>/<sha>/`` holds one adapter's files.

The address is the SHA-256 of the adapter's files (names and bytes), so the same adapter packed
as .zip or .tar.gz is stored once. Uploads unpack into a staging folder on the same filesystem and
are moved into place atomically, so a refused upload leaves nothing under the root.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class AdapterStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def staging_root(self) -> Path:
        return self.root / ".staging"

    @contextmanager
    def staging(self) -> Iterator[Path]:
        """A private scratch folder, removed on exit whatever happens."""
        self.staging_root.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(dir=self.staging_root))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def content_hash(folder: Path) -> str:
        digest = hashlib.sha256()
        for file in sorted(p for p in folder.iterdir() if p.is_file()):
            digest.update(file.name.encode() + b"\0" + str(file.stat().st_size).encode() + b"\0")
            with open(file, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        return digest.hexdigest()

    @staticmethod
    def relative_path(sha256: str) -> str:
        return f"{sha256[:2]}/{sha256}"

    def path_of(self, relative: str) -> Path:
        return self.root / relative

    def put(self, staged: Path, sha256: str) -> tuple[str, bool]:
        """Move ``staged`` to its address; returns (relative path, whether it was new)."""
        relative = self.relative_path(sha256)
        final = self.root / relative
        if final.exists():
            return relative, False
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staged, final)
        except OSError:
            if not final.exists():  # not a concurrent upload of the same content
                raise
            return relative, False
        return relative, True

    def remove(self, relative: str) -> None:
        shutil.rmtree(self.root / relative, ignore_errors=True)
        try:
            (self.root / relative).parent.rmdir()
        except OSError:
            pass

    def stored_paths(self) -> list[str]:
        """Every stored adapter folder (relative), for checks and housekeeping."""
        if not self.root.exists():
            return []
        return sorted(f"{d.parent.name}/{d.name}" for d in self.root.glob("??/*") if d.is_dir())
