"""AdapterRegistry: adapter name -> (path, version, content hash), and who still uses it.

The first tier of the LoRA manager (SGLang keeps the same seam in ``lora_registry.py``): it knows
names and versions, never weights. A name re-added with different content becomes a new version, so
nothing cached for the old content (host copies and device slots are keyed by ``(name, version)``)
is ever served again. A removed name is refused to new requests at once but stays, draining, until
the requests already holding it finish.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidRequestError, UnknownAdapterError
from ..sequence import AdapterRef
from .validate import AdapterInfo

AdapterKey = tuple[str, int]  # (name, version): what host copies and device slots are keyed by


class AdapterNotFoundError(UnknownAdapterError, KeyError):
    """No adapter of that name is registered (also a KeyError, for dict-like callers)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass
class AdapterEntry:
    name: str
    path: str
    version: int
    info: AdapterInfo
    removed: bool = False  # unregistered, draining its in-flight requests
    num_requests: int = 0  # queued + running

    @property
    def key(self) -> AdapterKey:
        return (self.name, self.version)

    @property
    def ref(self) -> AdapterRef:
        return AdapterRef(name=self.name, version=self.version, sha256=self.info.sha256)


class AdapterRegistry:
    def __init__(self) -> None:
        self._entries: dict[str, AdapterEntry] = {}  # active and draining
        self._versions = itertools.count(1)

    def get(self, name: str) -> AdapterEntry | None:
        """The entry of ``name``, active or draining (the engine's view of a running request)."""
        return self._entries.get(name)

    def active(self, name: str) -> AdapterEntry:
        """The entry new requests may use (raises AdapterNotFoundError)."""
        e = self._entries.get(name)
        if e is None or e.removed:
            raise AdapterNotFoundError(f"unknown adapter {name!r}", param="model")
        return e

    def names(self) -> list[str]:
        return sorted(n for n, e in self._entries.items() if not e.removed)

    def draining(self) -> list[str]:
        return sorted(n for n, e in self._entries.items() if e.removed)

    def busy_keys(self) -> set[AdapterKey]:
        """Versions some queued or running request still needs."""
        return {e.key for e in self._entries.values() if e.num_requests}

    def active_requests(self) -> dict[str, int]:
        return {n: e.num_requests for n, e in self._entries.items() if e.num_requests}

    def add(self, name: str, path: str | Path, info: AdapterInfo) -> tuple[AdapterEntry, AdapterEntry | None, bool]:
        """Register ``info`` under ``name``: (the entry, the replaced version to drop or None, whether
        the entry is new). Same content as the registered version: that entry, kept (re-activated if
        it was draining), and nothing to load."""
        old = self._entries.get(name)
        if old is not None:
            if old.info.sha256 == info.sha256:
                # Same content: nothing to reload. Re-added while draining (e.g. its cached files
                # were evicted and fetched again): it simply stays registered.
                old.path, old.removed = str(path), False
                return old, None, False
            if old.num_requests:
                raise InvalidRequestError(
                    f"adapter {name!r} cannot be replaced while {old.num_requests} request(s) still use it; "
                    f"wait for them to finish or register the new version under another name",
                    param="name",
                )
            del self._entries[name]
        entry = AdapterEntry(name=name, path=str(path), version=next(self._versions), info=info)
        self._entries[name] = entry
        return entry, old, True

    def remove(self, name: str) -> AdapterEntry | None:
        """Unregister ``name``: the entry to drop now, or None when it drains first."""
        e = self.active(name)
        if e.num_requests:
            e.removed = True  # drains: request_finished hands it back for dropping
            return None
        del self._entries[name]
        return e

    def request_added(self, name: str) -> AdapterEntry:
        e = self._entries[name]
        e.num_requests += 1
        return e

    def request_finished(self, name: str) -> AdapterEntry | None:
        """The entry to drop now (its last request finished after it was removed), or None."""
        e = self._entries.get(name)
        if e is None:
            return None
        e.num_requests = max(0, e.num_requests - 1)
        if e.removed and e.num_requests == 0:
            del self._entries[name]
            return e
        return None
