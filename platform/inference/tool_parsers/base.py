"""What every tool-call parser gives back: the text that is settled content and the calls read so
far. One ``scan`` serves both the finished output and the stream: the stream re-scans its growing
text and sends what is new (a parser only ever extends what it reported, so nothing is taken back).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol

from loraplex.platform.inference.tool_parsers.json_scan import Memo, ObjectCall

ARG_KEYS = ("arguments", "parameters")


@dataclass
class PartialCall:
    name: str | None  # None until its string is complete
    args: str = ""  # raw JSON text of the arguments written so far
    done: bool = False  # name and arguments complete
    streamable: bool = True  # False: the arguments came before the name; send it whole when done

    @classmethod
    def of(cls, obj: ObjectCall) -> PartialCall:
        done = obj.name is not None and (obj.args_done or (obj.end is not None and obj.args is None))
        args = obj.args if obj.args is not None else ("{}" if obj.end is not None else "")
        return cls(obj.name, args, done, not obj.args_before_name)

    def valid(self) -> bool:
        """A finished call a client can use: a name and arguments that are a JSON object."""
        if not self.done or not self.name:
            return False
        try:
            return isinstance(json.loads(self.args), dict)
        except ValueError:
            return False


@dataclass
class Scan:
    content: str  # text that is not part of a call (settled: it only grows as the output grows)
    calls: list[PartialCall] = field(default_factory=list)


class ToolParser(Protocol):
    name: str

    def scan(self, text: str, final: bool, memo: Memo | None = None) -> Scan:
        """``text``: the output so far; ``final``: it is complete. While not final, text that might
        still turn out to open a call is held back from ``content``. When final, a call that is
        incomplete or malformed is content again (cut off by max_tokens: the client gets the text)."""
        ...


def held_back(text: str, marker: str) -> int:
    """How many trailing characters of ``text`` could be the start of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0
