"""Stored responses (``store: true``): one row per response, always read and deleted through its
tenant, so a tenant can never see another's (an id of someone else's reads as absent: 404)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import String, Text, delete, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from loraplex.platform.db.base import Base, UTCDateTime, utcnow


class StoredResponse(Base):
    """No foreign key: like usage, a stored response is history; a deleted tenant's rows stay
    unreadable because every read goes through the caller's tenant id."""

    __tablename__ = "stored_responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(32), index=True)
    # The conversation a follow-up continues from (chat messages, without instructions) and the
    # Response object as returned.
    conversation: Mapped[str] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


def put(session: Session, tenant_id: str, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
    session.add(
        StoredResponse(
            id=response["id"],
            tenant_id=tenant_id,
            conversation=json.dumps(conversation, ensure_ascii=False),
            body=json.dumps(response, ensure_ascii=False),
        )
    )


def get(session: Session, tenant_id: str, response_id: str) -> StoredResponse | None:
    return session.scalars(
        select(StoredResponse).where(StoredResponse.id == response_id, StoredResponse.tenant_id == tenant_id)
    ).first()


def remove(session: Session, tenant_id: str, response_id: str) -> bool:
    result = session.execute(
        delete(StoredResponse).where(StoredResponse.id == response_id, StoredResponse.tenant_id == tenant_id)
    )
    return bool(getattr(result, "rowcount", 0))
