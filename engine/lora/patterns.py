"""Regular expressions that come from users (an adapter's ``target_modules``, ``rank_pattern`` and
``alpha_pattern`` keys), matched with RE2 rather than Python's ``re``.

``re`` backtracks: one nested quantifier such as ``(a+)+$`` against a module name makes it run for
minutes holding the GIL, which froze the whole server (issue 32). RE2 matches in time linear in the
input and refuses what it cannot do in linear time (backreferences, lookaround) with an error,
which we pass on naming the pattern. Patterns are bounded in length and count, so validating an
adapter's patterns costs at most ``MAX_PATTERNS x modules x MAX_PATTERN_CHARS`` steps.

The semantics are PEFT's (peft.utils.other): a string ``target_modules`` is ``re.fullmatch``-ed
against module names, a ``rank_pattern`` / ``alpha_pattern`` key ``k`` matches a module name when
``re.match(rf"(.*\\.)?({k})$", name)`` does. RE2 implements the same syntax for ordinary patterns
(tests/engine/test_user_patterns.py compares them).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2

MAX_PATTERN_CHARS = 1024
MAX_PATTERNS = 256  # keys of one rank_pattern / alpha_pattern
# RE2's memory for one compiled pattern (its default is 8 MiB; a pattern needing more is refused).
_MAX_MEM = 8 << 20


class PatternError(ValueError):
    """The pattern is too long, not valid, or needs a construct RE2 cannot match in linear time."""


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (cached: an adapter's keys are matched against every module)."""
    if not isinstance(pattern, str):
        raise PatternError(f"a pattern must be a string, got {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"pattern is {len(pattern)} characters, more than the limit of {MAX_PATTERN_CHARS}")
    options = re2.Options()
    options.log_errors = False  # the error comes back to the caller, not to stderr
    options.max_mem = _MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        msg = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PatternError(
            f"{msg} (patterns are matched in linear time by RE2: no backreferences or lookaround)"
        ) from None


def fullmatch(pattern: str, name: str) -> bool:
    """PEFT's string ``target_modules``: the pattern matches the whole module name."""
    return compile_pattern(pattern).fullmatch(name) is not None


def suffix_match(key: str, name: str) -> bool:
    """PEFT's ``rank_pattern`` / ``alpha_pattern`` key: it matches the end of the module name,
    at a dot boundary or the start."""
    return compile_pattern(rf"(.*\.)?({key})$").match(name) is not None
