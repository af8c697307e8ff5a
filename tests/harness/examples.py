"""How many examples a Hypothesis property runs: all of them in the whole suite (CI), a fifth in the
inner loop.

A test says ``@settings(max_examples=examples(150), ...)``. The root conftest selects the ``dev``
count when pytest runs with ``-m "not slow"`` (the inner loop, CONTRIBUTING.md), unless
``LORAPLEX_HYPOTHESIS_PROFILE`` says otherwise (``full`` or ``dev``). A Hypothesis profile alone
would not do: a test's own ``@settings(max_examples=...)`` overrides the loaded profile.
"""

from __future__ import annotations

import os

PROFILE_ENV = "LORAPLEX_HYPOTHESIS_PROFILE"


def examples(full: int) -> int:
    """``full`` in the whole suite; a fifth of it (at least 10) in the inner loop."""
    if os.environ.get(PROFILE_ENV, "full") == "dev":
        return max(10, full // 5)
    return full
