from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loraplex.platform.keys.schemas import Limit, ModelName
from loraplex.platform.tenants.schemas import Name, Priority, Weight

Models = Annotated[list[ModelName], Field(max_length=1000)]


class ProjectCreate(BaseModel):
    """A project of a tenant. ``models``: what its keys may use, inside the tenant's (None: all of
    the tenant's); ``rpm``/``tpm``/``max_concurrent``: limits on top of the tenant's (None: none of
    its own); ``priority`` and ``weight`` order and split the tenant's share among its projects."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    rpm: Limit | None = None
    tpm: Limit | None = None
    max_concurrent: Limit | None = None
    models: Models | None = None
    priority: Priority = 0
    weight: Weight = 1.0


class ProjectUpdate(BaseModel):
    """Fields sent are changed; a limit or ``models`` sent as null is cleared."""

    model_config = ConfigDict(extra="forbid")

    name: Name | None = None
    rpm: Limit | None = None
    tpm: Limit | None = None
    max_concurrent: Limit | None = None
    models: Models | None = None
    priority: Priority | None = None
    weight: Weight | None = None

    @model_validator(mode="after")
    def _no_nulls(self) -> ProjectUpdate:
        for field in ("name", "priority", "weight"):
            if field in self.model_fields_set and getattr(self, field) is None:
                raise ValueError(f"{field} cannot be null")
        return self


class ProjectOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    object: Literal["project"] = "project"
    id: str
    tenant_id: str
    name: str
    rpm: int | None
    tpm: int | None
    max_concurrent: int | None
    models: list[str] | None = Field(validation_alias="allowed_models")
    priority: int
    weight: float
    status: Literal["active", "archived"]
    created_at: datetime
    archived_at: datetime | None


class ProjectList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ProjectOut]
