"""A budget's window in its own timezone (platform/budgets/periods.py): daylight-saving days of 23
hours (Paris) and a midnight that does not exist (Santiago starts DST at 00:00), weeks from Monday,
a month that starts while UTC is still in the old year (UTC+14), "total" from the epoch; and the
timezone check (IANA names from the system's list only, never a path)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from loraplex.platform.budgets.periods import EPOCH, window_end, window_start, zone


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("period", "tz", "now", "start", "end"),
    [
        ("daily", "Europe/Paris", utc(2026, 3, 29, 12), utc(2026, 3, 28, 23), utc(2026, 3, 29, 22)),  # 23 h
        ("daily", "Europe/Paris", utc(2026, 10, 25, 12), utc(2026, 10, 24, 22), utc(2026, 10, 25, 23)),  # 25 h
        ("daily", "America/Santiago", utc(2026, 9, 6, 12), utc(2026, 9, 6, 4), utc(2026, 9, 7, 3)),  # no 00:00
        ("weekly", "UTC", utc(2026, 12, 6, 12), utc(2026, 11, 30), utc(2026, 12, 7)),  # a Sunday: from Monday
        ("weekly", "UTC", utc(2026, 12, 7), utc(2026, 12, 7), utc(2026, 12, 14)),  # Monday 00:00 starts one
        ("monthly", "Pacific/Kiritimati", utc(2026, 12, 31, 11), utc(2026, 12, 31, 10), utc(2027, 1, 31, 10)),
        ("monthly", "UTC", utc(2026, 12, 31, 23, 59), utc(2026, 12, 1), utc(2027, 1, 1)),
    ],
)
def test_windows(period, tz, now, start, end):
    assert window_start(period, tz, now) == start
    assert window_end(period, tz, start) == end
    assert window_start(period, tz, end) == end  # the end is the next window's start


def test_total_never_ends():
    assert window_start("total", "Asia/Tokyo", utc(2031, 1, 1)) == EPOCH
    assert window_end("total", "Asia/Tokyo", EPOCH) is None


@pytest.mark.parametrize("name", ["UTC", "Europe/Paris", "Asia/Kolkata", "America/Argentina/Buenos_Aires"])
def test_known_zones(name):
    assert zone(name) is not None


@pytest.mark.parametrize(
    "name", ["", "Mars/Base", "/etc/localtime", "../zoneinfo/UTC", "Europe/Paris\x00", "É", "x" * 65, None, 5]
)
def test_unknown_zones(name):
    assert zone(name) is None
