from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class AdapterOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    object: Literal["adapter"] = "adapter"
    id: str
    name: str
    version: int
    visibility: str
    owner_tenant_id: str | None
    base_model: str
    rank: int
    alpha: float
    target_modules: list[str]
    use_rslora: bool
    sha256: str
    size_bytes: int
    status: str
    status_reason: str | None = None  # why an adapter is "unavailable"
    created_at: datetime
    granted_tenant_ids: list[str] = []


class AdapterList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AdapterOut]


class GrantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str


class GrantOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    object: Literal["adapter_grant"] = "adapter_grant"
    adapter_id: str
    tenant_id: str
    created_at: datetime
