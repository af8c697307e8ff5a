from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Limit = Annotated[int | None, Field(ge=1, le=2**31 - 1)]  # rpm, tpm, max_concurrent: SQL INTEGER columns
BudgetLimit = Annotated[int | None, Field(ge=1, le=10**12)]  # a BIGINT column


class QuotaIn(BaseModel):
    """A tenant's limits; null (or absent) means unlimited."""

    model_config = ConfigDict(extra="forbid")

    rpm: Limit = None
    tpm: Limit = None
    max_concurrent: Limit = None
    token_budget: BudgetLimit = None
    budget_period: Literal["day", "month"] = "month"
    # Seconds one generation may run (null = the server's limits.generation_timeout_s).
    max_generation_s: Annotated[float | None, Field(gt=0, le=86400)] = None


class QuotaOut(QuotaIn):
    model_config = ConfigDict(from_attributes=True)

    object: Literal["quota"] = "quota"
    tenant_id: str
