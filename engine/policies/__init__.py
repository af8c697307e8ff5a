"""Pluggable scheduling policies. ``make_policy(config)`` builds the configured one."""

from __future__ import annotations

from ..config import SchedulerConfig
from .base import SchedulingPolicy
from .fair import FairPolicy
from .fcfs import FCFSPolicy
from .priority import PriorityPolicy
from .sjf import SJFPolicy
from .tenants import TenantBook, TenantCaps, TenantLimits


def make_policy(config: SchedulerConfig) -> SchedulingPolicy:
    name = config.scheduling_policy
    limits = TenantLimits.from_config(config)
    if name == "fcfs":
        return FCFSPolicy(limits)
    if name == "priority":
        return PriorityPolicy(limits, aging_s=config.priority_aging_s)
    if name == "fair":
        return FairPolicy(
            limits,
            aging_s=config.priority_aging_s,
            prompt_weight=config.vtc_prompt_weight,
            output_weight=config.vtc_output_weight,
            locality_slack=config.lora_locality_slack,
            share_preemption=config.fair_share_preemption,
        )
    if name == "sjf":
        return SJFPolicy(limits, aging_s=config.priority_aging_s)
    raise ValueError(f"unknown scheduling policy {name!r}")


__all__ = [
    "FCFSPolicy",
    "FairPolicy",
    "PriorityPolicy",
    "SJFPolicy",
    "SchedulingPolicy",
    "TenantBook",
    "TenantCaps",
    "TenantLimits",
    "make_policy",
]
