from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

GroupBy = Literal["hour", "day", "adapter"]


class UsageBucket(BaseModel):
    key: str  # ISO hour/day start (UTC) or the adapter name ("" = base model)
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class UsageReport(BaseModel):
    object: Literal["usage_report"] = "usage_report"
    group_by: GroupBy
    tenant_id: str | None
    data: list[UsageBucket]
    totals: UsageBucket
