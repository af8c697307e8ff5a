from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from loraplex.platform.alerts.events import AlertKind


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: Annotated[str, Field(min_length=1, max_length=2048)]
    # The HMAC key deliveries are signed with ("whsec_<base64>" as Standard Webhooks writes it, or
    # any string of 16+ characters). Write-only: never returned.
    secret: Annotated[str, Field(min_length=16, max_length=256)]
    events: list[AlertKind] = Field(default_factory=list, max_length=16)  # empty = every kind
    tenant_id: Annotated[str | None, Field(max_length=40)] = None  # only this tenant's events

    @field_validator("secret")
    @classmethod
    def _signable(cls, v: str) -> str:
        """A ``whsec_`` secret is the base64 of the key: refused here unless it decodes (strictly)
        to 16+ bytes. Found by the hostile round: "whsec_" + 17 letters failed only at delivery
        (a delivery that could never be signed), and "whsec_!!!..." signed with an EMPTY key."""
        if v.startswith("whsec_"):
            try:
                key = base64.b64decode(v[len("whsec_") :], validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("a whsec_ secret must be the base64 of its key") from None
            if len(key) < 16:
                raise ValueError("a whsec_ secret's key must be at least 16 bytes") from None
        return v


class WebhookOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    object: Literal["webhook"] = "webhook"
    id: str
    url: str
    events: list[str]
    tenant_id: str | None
    created_at: datetime


class WebhookList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookOut]


class DeliveryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    webhook_id: str
    state: Literal["pending", "delivered", "dead"]
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    delivered_at: datetime | None


class AlertEventOut(BaseModel):
    object: Literal["alert_event"] = "alert_event"
    id: str
    type: str
    tenant_id: str | None
    key_id: str | None
    created_at: datetime
    data: dict
    # "pending" until fanned out to the webhooks, then "fanned_out" (see deliveries)
    state: Literal["pending", "fanned_out"]
    deliveries: list[DeliveryOut]


class AlertEventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AlertEventOut]
