from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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
    source_uri: str | None = None  # registered by reference: where the files live
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


class RegisterByReference(BaseModel):
    """``POST /admin/v1/adapters`` with a JSON body: an adapter that lives in a store or folder."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=64)
    source: str = Field(max_length=1024, description="s3://bucket/prefix/, file:///abs/path or hf://org/repo[@rev]")
    visibility: str = Field("private", max_length=16)
    tenant_id: str | None = Field(None, max_length=64)
    new_version: bool = False
