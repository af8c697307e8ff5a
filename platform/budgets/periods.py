"""A budget's window: where the current period started and where it ends, in the budget's own
IANA timezone (a "daily" budget in Asia/Tokyo resets at Tokyo's midnight). Weekly periods start on
Monday; "total" never resets (its window starts at the epoch). Boundaries are computed on the
local wall clock and converted to UTC, so a daylight-saving change makes a day 23 or 25 hours long,
as a person in that timezone would expect."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

PERIODS = ("daily", "weekly", "monthly", "total")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_TZ_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/_+-")


def zone(name: str) -> ZoneInfo | None:
    """The IANA zone of ``name``, or None when it is not one. Only names in the system's list are
    accepted (``ZoneInfo`` alone also opens any file path under the tz directory)."""
    if not isinstance(name, str) or not 0 < len(name) <= 64 or not set(name) <= _TZ_CHARS:
        return None
    if name not in _known():
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


_KNOWN: frozenset[str] | None = None


def _known() -> frozenset[str]:
    global _KNOWN
    if _KNOWN is None:
        _KNOWN = frozenset(available_timezones()) | {"UTC"}
    return _KNOWN


def window_start(period: str, tz_name: str, now: datetime) -> datetime:
    """The UTC instant the period containing ``now`` began."""
    if period == "total":
        return EPOCH
    tz = zone(tz_name) or timezone.utc
    local = now.astimezone(tz)
    day = local.replace(hour=0, minute=0, second=0, microsecond=0, tzinfo=None)
    if period == "weekly":
        day -= timedelta(days=day.weekday())  # Monday
    elif period == "monthly":
        day = day.replace(day=1)
    return _to_utc(day, tz)


def window_end(period: str, tz_name: str, start: datetime) -> datetime | None:
    """The UTC instant the period starting at ``start`` ends (None: "total" never ends)."""
    if period == "total":
        return None
    tz = zone(tz_name) or timezone.utc
    local = start.astimezone(tz).replace(tzinfo=None)
    if period == "daily":
        nxt = local + timedelta(days=1)
    elif period == "weekly":
        nxt = local + timedelta(days=7)
    else:
        nxt = local.replace(year=local.year + 1, month=1) if local.month == 12 else local.replace(month=local.month + 1)
    return _to_utc(nxt.replace(hour=0, minute=0, second=0, microsecond=0), tz)


def _to_utc(local_midnight: datetime, tz: ZoneInfo | timezone) -> datetime:
    # A midnight skipped by a DST change (a few zones jump at 00:00) resolves forward, fold=0.
    return local_midnight.replace(tzinfo=tz).astimezone(timezone.utc)
