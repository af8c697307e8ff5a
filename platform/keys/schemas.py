from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

ModelName = Annotated[str, Field(min_length=1, max_length=255)]
Limit = Annotated[int, Field(ge=1, le=2**31 - 1)]


class KeyScope(BaseModel):
    """What a key may use: ``allowed_models`` (None = everything its tenant may use) and limits of
    its own on top of the tenant's (None = only the tenant's apply)."""

    model_config = ConfigDict(extra="forbid")

    allowed_models: Annotated[list[ModelName], Field(max_length=1000)] | None = None
    rpm: Limit | None = None
    tpm: Limit | None = None
    max_concurrent: Limit | None = None


class KeyCreate(KeyScope):
    name: Annotated[str, Field(max_length=64)] = ""
    expires_at: AwareDatetime | None = None
    project_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None  # one of its tenant's


class KeyOut(BaseModel):
    """A key as listed: never the key itself, only its first characters."""

    model_config = ConfigDict(from_attributes=True)

    object: Literal["api_key"] = "api_key"
    id: str
    tenant_id: str
    name: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    allowed_models: list[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    project_id: str | None = None


class KeyCreated(KeyOut):
    key: str = Field(description="The full key. Shown this once; store it now.")


class KeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[KeyOut]
