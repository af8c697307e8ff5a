"""Pluggable scheduling policies. ``make_policy(config)`` builds the configured one."""
from __future__ import annotations

from .base import SchedulingPolicy
from .fcfs import FCFSPolicy


def make_policy(config) -> SchedulingPolicy:
    name = config.scheduling_policy
    if name == "fcfs":
        return FCFSPolicy()
    raise ValueError(f"scheduling policy {name!r} is not available yet")


__all__ = ["FCFSPolicy", "SchedulingPolicy", "make_policy"]
