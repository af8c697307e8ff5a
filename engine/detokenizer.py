"""Incremental detokenization and stop-string detection.

Decoding the whole output every step is quadratic; instead we decode a short window of recent
tokens and emit only the text that has become stable (byte-level BPE can split a UTF-8 character
across tokens, which decodes to U+FFFD until the rest arrives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DetokState:
    prefix_offset: int = 0
    read_offset: int = 0


def append_text(tokenizer: Any, seq: Any, state: DetokState, upto: int | None = None) -> str:
    """Extend ``seq.text`` with whatever the newly appended tokens spell (the first ``upto`` output
    tokens only, when given: a step that emitted several is read one token at a time). Returns the delta."""
    ids = seq.output_token_ids if upto is None else seq.output_token_ids[:upto]
    prefix = tokenizer.decode(ids[state.prefix_offset : state.read_offset], skip_special_tokens=True)
    full = tokenizer.decode(ids[state.prefix_offset :], skip_special_tokens=True)
    if len(full) > len(prefix) and not full.endswith("\ufffd"):
        delta: str = full[len(prefix) :]
        state.prefix_offset, state.read_offset = state.read_offset, len(ids)
        seq.text += delta
        return delta
    return ""


def flush_text(tokenizer: Any, seq: Any, state: DetokState) -> str:
    """At the end of a sample: append whatever is still pending (an incomplete UTF-8 tail decodes
    to U+FFFD, as a one-shot decode of the same tokens spells it). Returns the delta."""
    ids = seq.output_token_ids
    prefix = tokenizer.decode(ids[state.prefix_offset : state.read_offset], skip_special_tokens=True)
    full = tokenizer.decode(ids[state.prefix_offset :], skip_special_tokens=True)
    delta = full[len(prefix) :] if len(full) > len(prefix) else ""
    seq.text += delta
    state.prefix_offset = state.read_offset = len(ids)
    return delta


def find_stop_string(text: str, stops: list[str], new_chars: int) -> tuple[int, str] | None:
    """Earliest stop string that overlaps the last ``new_chars`` characters: (index, stop)."""
    if not stops or new_chars <= 0:
        return None
    best = None
    for stop in stops:
        start = max(0, len(text) - new_chars - len(stop) + 1)
        i = text.find(stop, start)
        if i != -1 and (best is None or i < best[0]):
            best = (i, stop)
    return best
