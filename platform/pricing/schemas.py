from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

SpendGroupBy = Literal["tenant", "project", "key", "model", "day"]


class PriceCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=255, description='A base model, an adapter, or "*" (any model)')
    # Decimal strings, never floats: "0.15" is exactly 0.15 per million tokens.
    input_per_mtok: str = Field(max_length=32)
    cached_input_per_mtok: str | None = Field(
        default=None, max_length=32, description="Defaults to input_per_mtok (no cache discount)"
    )
    output_per_mtok: str = Field(max_length=32)
    currency: str = Field(default="USD", pattern=r"^[A-Za-z]{3}$")
    effective_from: AwareDatetime | None = Field(default=None, description="Now when omitted; never in the past")


class PriceOut(BaseModel):
    id: str
    object: Literal["price"] = "price"
    model: str
    input_per_mtok: str
    cached_input_per_mtok: str
    output_per_mtok: str
    currency: str
    effective_from: datetime
    created_by: str
    created_at: datetime


class PriceList(BaseModel):
    object: Literal["list"] = "list"
    currency: str | None
    data: list[PriceOut]


class SpendBucket(BaseModel):
    key: str  # the tenant / key id, the model, or the UTC day (ISO); "total" for the totals
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost: str  # exact decimal text in the book's currency
    unpriced_requests: int  # records no price covered when they were served (cost 0)


class SpendReport(BaseModel):
    object: Literal["spend_report"] = "spend_report"
    group_by: SpendGroupBy
    currency: str | None
    tenant_id: str | None
    start: datetime | None
    end: datetime | None
    data: list[SpendBucket]
    totals: SpendBucket
