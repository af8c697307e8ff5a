"""CSV exports opened in a spreadsheet: a cell starting with ``=``, ``+``, ``-``, ``@`` (or a tab
or carriage return, which some spreadsheets skip before reading one of those) is a formula there.
Tenants write some exported text themselves (OpenAI's ``user`` field, their ``x-request-id``), so
such a cell could run ``=HYPERLINK(...)`` or worse on the operator's machine (CSV injection,
OWASP). Text cells that start so are prefixed with ``'``, which spreadsheets show as text and do
not display; numbers are left as they are. The JSON-lines export is not changed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def safe_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: cell(v) for k, v in row.items()}
