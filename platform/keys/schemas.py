from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(max_length=64)] = ""
    expires_at: AwareDatetime | None = None


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


class KeyCreated(KeyOut):
    key: str = Field(description="The full key. Shown this once; store it now.")


class KeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[KeyOut]
