"""Incremental reading of JSON text that is still being generated.

The tool-call parsers see the model's output grow a token at a time; they need to know, at every
step, which part of it is already settled: a complete key, a complete name string, and how much of
an ``arguments`` value has been written so far (its raw text is a prefix of the final text, so it can
be streamed as it grows without ever taking a character back)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

WS = " \t\r\n"


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WS:
        i += 1
    return i


_STRUCTURE = re.compile(r'["{}\[\]]')
_STRING_STOP = re.compile(r'["\\]')

# A stream re-scans its growing text after every token; the text only grows, so a container's scan
# resumes where the previous one stopped: ``memo[start] = (position, depth)``. Without it a long
# arguments object costs O(length) per token (seconds of event-loop time for one long call).
Memo = dict[int, tuple[int, int]]
# The names of the tools a request offers; a "call" to any other is not a call (None: no check).
Offered = frozenset[str] | None


def string_end(text: str, i: int) -> int | None:
    """``text[i]`` is a quote: the index after the closing quote, or None if the string is open."""
    j = i + 1
    while True:
        m = _STRING_STOP.search(text, j)
        if m is None:
            return None
        if m.group() == "\\":
            j = m.start() + 2
            continue
        return m.start() + 1


def value_end(text: str, i: int, memo: Memo | None = None) -> int | None:
    """The index after the JSON value starting at ``text[i]``, or None while it is incomplete
    (a number or literal at the very end may still grow, so it is incomplete too)."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return string_end(text, i)
    if c in "{[":
        j, depth = memo.get(i, (i, 0)) if memo is not None else (i, 0)
        while True:
            m = _STRUCTURE.search(text, j)
            if m is None:
                if memo is not None:
                    memo[i] = (len(text), depth)
                return None
            c, k = m.group(), m.start()
            if c == '"':
                end = string_end(text, k)
                if end is None:
                    if memo is not None:
                        memo[i] = (k, depth)  # resume at the open string
                    return None
                j = end
                continue
            depth += 1 if c in "{[" else -1
            j = k + 1
            if depth == 0:
                return j
    j = i
    while j < len(text) and text[j] not in WS + ",}]":
        j += 1
    return j if j < len(text) else None


@dataclass
class ObjectCall:
    """What is known so far of one ``{"name": ..., "<args key>": {...}}`` object."""

    start: int = 0  # index of the opening brace
    name: str | None = None
    args: str | None = None  # raw text of the arguments value written so far (None: not started)
    args_done: bool = False
    end: int | None = None  # index after the closing brace, once complete
    args_before_name: bool = False  # the arguments came first: they cannot stream before the name


def read_call_object(
    text: str, i: int, arg_keys: tuple[str, ...], memo: Memo | None = None, offered: Offered = None
) -> ObjectCall | None:
    """Read the call object starting at ``text[i] == "{"`` as far as it is written; None when it is
    malformed (not an object of string keys) or, once its name is complete, names a tool that is
    not in ``offered`` (None: any name)."""
    call = ObjectCall(start=i)
    j = skip_ws(text, i + 1)
    while True:
        if j >= len(text):
            return call
        if text[j] == "}":
            call.end = j + 1
            return call
        if text[j] == ",":
            j = skip_ws(text, j + 1)
            continue
        if text[j] != '"':
            return None
        k_end = string_end(text, j)
        if k_end is None:
            return call
        key = json.loads(text[j:k_end])
        j = skip_ws(text, k_end)
        if j >= len(text):
            return call
        if text[j] != ":":
            return None
        j = skip_ws(text, j + 1)
        if j >= len(text):
            return call
        v_end = value_end(text, j, memo)
        if key == "name":
            if text[j] != '"':
                return None
            if v_end is None:
                return call
            call.name = json.loads(text[j:v_end])
            if offered is not None and call.name not in offered:
                return None
        elif key in arg_keys:
            call.args_before_name = call.name is None
            if v_end is None:
                call.args = text[j:]
                return call
            call.args = text[j:v_end]
            call.args_done = True
        elif v_end is None:
            return call
        j = skip_ws(text, v_end)


def read_call_list(
    text: str, i: int, arg_keys: tuple[str, ...], memo: Memo | None = None, offered: Offered = None
) -> tuple[list[ObjectCall], int | None, int | None]:
    """Read the array of call objects starting at ``text[i] == "["``: (calls so far, index after
    the closing bracket or None while open, index where a malformed element starts or None). The
    calls before a malformed element stand (a stream has already sent them)."""
    calls: list[ObjectCall] = []
    j = skip_ws(text, i + 1)
    while j < len(text):
        c = text[j]
        if c == "]":
            return calls, j + 1, None
        if c == ",":
            j = skip_ws(text, j + 1)
            continue
        if c != "{":
            return calls, None, j
        call = read_call_object(text, j, arg_keys, memo, offered)
        if call is None:
            return calls, None, j
        calls.append(call)
        if call.end is None:
            return calls, None, None
        j = skip_ws(text, call.end)
    return calls, None, None
