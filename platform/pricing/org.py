"""A tenant's own usage and costs in the shapes of OpenAI's Usage API
(``/v1/organization/usage/completions``) and Costs API (``/v1/organization/costs``).

The tenant is OpenAI's organization and its projects (``platform/projects``) are OpenAI's projects:
``project_id`` is the project of the key that made the request (null for a key of no project).
Buckets start at ``start_time`` and step by the
bucket width; a page holds up to ``limit`` buckets, and ``next_page`` is the next bucket's start."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func
from sqlalchemy.orm import Session

from loraplex.platform.errors import BadRequest
from loraplex.platform.pricing import money, repository
from loraplex.platform.pricing.book import Cost, cost_of
from loraplex.platform.pricing.service import load_book
from loraplex.platform.usage.models import UsageRecord

WIDTHS = {"1m": 60, "1h": 3600, "1d": 86400}
# OpenAI's limits on buckets per page: (default, maximum) by width.
USAGE_LIMITS = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}
COSTS_LIMITS = {"1d": (7, 180)}
USAGE_GROUPS = ("project_id", "api_key_id", "model")
COSTS_GROUPS = ("project_id", "line_item", "api_key_id", "model")
MAX_TIME = 253402300799  # 9999-12-31T23:59:59Z: later is no time a database stores

_LINE_ITEMS = (("input", "input"), ("cached input", "cached_input"), ("output", "output"))


@dataclass(frozen=True)
class Page:
    start_time: int
    end_time: int
    width: int
    first: int  # the first bucket's start on this page
    count: int  # buckets on this page
    next_page: str | None


def page_of(
    start_time: int, end_time: int | None, width_name: str, limit: int | None, page: str | None, limits: dict
) -> Page:
    if width_name not in limits:
        raise BadRequest(f"bucket_width must be one of {', '.join(limits)}", param="bucket_width")
    width = WIDTHS[width_name]
    default_limit, max_limit = limits[width_name]
    limit = default_limit if limit is None else limit
    if not 1 <= limit <= max_limit:
        raise BadRequest(f"limit must be between 1 and {max_limit} for bucket_width {width_name}", param="limit")
    if not 0 <= start_time <= MAX_TIME:
        raise BadRequest("start_time must be Unix seconds between 0 and 253402300799", param="start_time")
    end = int(datetime.now(timezone.utc).timestamp()) + 1 if end_time is None else end_time
    if not start_time < end <= MAX_TIME + 1:
        raise BadRequest("end_time must be later than start_time (Unix seconds)", param="end_time")
    first = start_time
    if page is not None:
        first = _cursor(page, start_time, end, width)
    total = -(-(end - first) // width)  # buckets from ``first`` up to end, the last one partial
    count = min(limit, total)
    after = first + count * width
    return Page(start_time, end, width, first, count, f"page_{after}" if after < end else None)


def _cursor(page: str, start: int, end: int, width: int) -> int:
    value = page.removeprefix("page_")
    # isdigit() alone is true of "²", which int() refuses: ASCII digits only, as next_page writes them
    if not (value.isascii() and value.isdigit()) or len(value) > 12:
        raise BadRequest("page is not a cursor this endpoint returned (next_page)", param="page")
    at = int(value)
    if not start <= at < end or (at - start) % width:
        raise BadRequest("page is not a cursor of this query (start_time, end_time, bucket_width)", param="page")
    return at


def _rows(session: Session, tenant_id: str, p: Page, group_by: tuple[str, ...], changes: list, **filters: Any):
    page_end = min(p.first + p.count * p.width, p.end_time)
    bucket = (repository.epoch_seconds(session) - p.start_time) // p.width
    groups: list[Any] = [bucket]
    by_key, by_project = "api_key_id" in group_by, "project_id" in group_by
    if by_key:
        groups.append(func.coalesce(UsageRecord.api_key_id, ""))
    if by_project:
        groups.append(func.coalesce(UsageRecord.project_id, ""))
    rows = repository.sums(
        session,
        groups,
        changes,
        tenant_id=tenant_id,
        since=datetime.fromtimestamp(p.first, timezone.utc),
        # end_time may be MAX_TIME + 1 (year 10000), which no datetime holds: no upper bound then
        until=datetime.fromtimestamp(page_end, timezone.utc) if page_end <= MAX_TIME else None,
        **filters,
    )
    # One shape whatever the grouping: (bucket, key id, project id, adapter, base, segment, sums...)
    for row in rows:
        idx, rest = row[0], list(row[1:])
        key_id = rest.pop(0) if by_key else None
        project_id = rest.pop(0) if by_project else None
        yield (idx, key_id or None, project_id or None, *rest)


def _empty_page(p: Page) -> dict[int, dict]:
    """This page's buckets by index from start_time (OpenAI lists empty buckets too)."""
    first = (p.first - p.start_time) // p.width
    return {
        i: {
            "object": "bucket",
            "start_time": p.start_time + i * p.width,
            "end_time": p.start_time + (i + 1) * p.width,
            "results": [],
        }
        for i in range(first, first + p.count)
    }


def _page(p: Page, buckets: dict[int, dict]) -> dict:
    return {
        "object": "page",
        "data": [buckets[i] for i in sorted(buckets)],
        "has_more": p.next_page is not None,
        "next_page": p.next_page,
    }


def usage_completions(
    session: Session,
    tenant_id: str,
    p: Page,
    group_by: tuple[str, ...],
    *,
    api_key_ids: list[str] | None,
    models: list[str] | None,
    project_ids: list[str],
) -> dict:
    buckets = _empty_page(p)
    sums: dict[tuple, list[int]] = {}
    filters = {"key_ids": api_key_ids, "models": models, "project_ids": project_ids or None}
    for idx, key_id, project_id, adapter, base, _seg, n, pt, ct, ot in _rows(
        session, tenant_id, p, group_by, [], **filters
    ):
        model = (adapter or base or "") if "model" in group_by else None
        acc = sums.setdefault((int(idx), key_id, project_id, model), [0, 0, 0, 0])
        for k, v in enumerate((n, pt, ct, ot)):
            acc[k] += int(v)
    for (idx, key_id, project_id, model), (n, pt, ct, ot) in sorted(
        sums.items(), key=lambda kv: (kv[0][0], str(kv[0][1:]))
    ):
        buckets[idx]["results"].append(
            {
                "object": "organization.usage.completions.result",
                "input_tokens": pt,
                "output_tokens": ot,
                "input_cached_tokens": ct,
                "input_audio_tokens": 0,
                "output_audio_tokens": 0,
                "num_model_requests": n,
                "project_id": project_id,
                "user_id": None,
                "api_key_id": key_id or None,
                "model": model,
                "batch": None,
                "service_tier": None,
            }
        )
    return _page(p, buckets)


def costs(
    session: Session,
    tenant_id: str,
    p: Page,
    group_by: tuple[str, ...],
    *,
    models: list[str] | None,
    project_ids: list[str],
) -> dict:
    buckets = _empty_page(p)
    book = load_book(session)
    currency = (book.currency or "USD").lower()
    by_model = "model" in group_by or "line_item" in group_by
    sums: dict[tuple, Cost] = {}
    filters = {"models": models, "project_ids": project_ids or None}
    for idx, key_id, project_id, adapter, base, seg, _n, pt, ct, ot in _rows(
        session, tenant_id, p, group_by, book.changes, **filters
    ):
        rate = book.match_segment(adapter, base, int(seg))
        cost = cost_of(rate, int(pt), int(ct), int(ot)) if rate else Cost()
        model = (adapter or base or "") if by_model else None
        k = (int(idx), key_id, project_id, model)
        sums[k] = sums.get(k, Cost()) + cost
    for (idx, key_id, project_id, model), cost in sorted(sums.items(), key=lambda kv: (kv[0][0], str(kv[0][1:]))):
        parts = (
            [(f"{model}, {label}", getattr(cost, attr)) for label, attr in _LINE_ITEMS]
            if "line_item" in group_by
            else [(None, cost.total)]
        )
        for line_item, units in parts:
            result = {
                "object": "organization.costs.result",
                "amount": {
                    "value": money.cost_number(units),
                    "currency": currency,
                    "value_exact": money.cost_text(units),
                },
                "line_item": line_item,
                "project_id": project_id,
            }
            if "api_key_id" in group_by:
                result["api_key_id"] = key_id or None
            if "model" in group_by:
                result["model"] = model
            buckets[idx]["results"].append(result)
    return _page(p, buckets)


def check_groups(group_by: list[str], allowed: tuple[str, ...]) -> tuple[str, ...]:
    for g in group_by:
        if g not in allowed:
            raise BadRequest(f"group_by must be among {', '.join(allowed)} (got {g!r})", param="group_by")
    return tuple(dict.fromkeys(group_by))
