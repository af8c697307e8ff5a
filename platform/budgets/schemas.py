from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Period = Literal["daily", "weekly", "monthly", "total"]


class BudgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # A decimal string ("25.00"), checked by ``amounts.parse_amount``: never a JSON number (a float
    # would round), never negative, NaN, an exponent or another script's digits.
    amount: Any = Field(description='Decimal string, e.g. "25.00" (at most 6 decimals, up to 1000000)')
    period: Period = "monthly"
    timezone: str = Field(default="UTC", max_length=64, description="IANA timezone the period resets in")
    currency: str | None = Field(
        default=None, max_length=3, description="Defaults to the price book's currency (USD with no prices)"
    )


class BudgetOut(BaseModel):
    object: Literal["budget"] = "budget"
    scope: str
    scope_id: str
    tenant_id: str
    amount: str
    currency: str
    period: str
    timezone: str
    # The current window (the period in the budget's timezone; "total": since the budget was set)
    window_start: datetime
    window_end: datetime | None
    spent: str  # settled cost of the requests admitted in this window
    reserved: str  # worst-case cost held by requests still running
    remaining: str
    updated_by: str
    updated_at: datetime
