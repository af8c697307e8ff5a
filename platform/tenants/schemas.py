from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Priority = Annotated[int, Field(ge=0, le=9, description="Priority class; lower runs first")]
Weight = Annotated[float, Field(gt=0, le=1000, description="Fair-share weight within a class")]
Status = Literal["active", "suspended"]


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    priority: Priority = 0
    weight: Weight = 1.0
    status: Status = "active"


class TenantUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name | None = None
    priority: Priority | None = None
    weight: Weight | None = None
    status: Status | None = None

    @model_validator(mode="after")
    def _no_nulls(self) -> TenantUpdate:
        for field in self.model_fields_set:
            if getattr(self, field) is None:
                raise ValueError(f"{field} cannot be null")
        return self


class TenantOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    object: Literal["tenant"] = "tenant"
    id: str
    name: str
    priority: int
    weight: float
    status: str
    created_at: datetime
    updated_at: datetime


class TenantList(BaseModel):
    object: Literal["list"] = "list"
    data: list[TenantOut]
    total: int


class Deleted(BaseModel):
    id: str
    object: str
    deleted: bool = True
