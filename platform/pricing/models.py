from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from loraplex.platform.db.base import Base, UTCDateTime, new_id, utcnow


class Price(Base):
    """One price of one model from ``effective_from`` on, until a later row of the same model.

    Rows are never updated or deleted: a price change is a new row, so the cost of every usage
    record stays what it was when it was served (costs are computed at read time from this history).
    Rates are integers: micro-units of the currency per million tokens (6 decimal places, exact)."""

    __tablename__ = "prices"
    __table_args__ = (UniqueConstraint("model", "effective_from", name="uq_prices_model_effective_from"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("prc"))
    # A base model's served name, an adapter's name, or "*" (every model without a price of its own).
    model: Mapped[str] = mapped_column(String(255), index=True)
    currency: Mapped[str] = mapped_column(String(3))
    input_micros_per_mtok: Mapped[int] = mapped_column(BigInteger)
    cached_input_micros_per_mtok: Mapped[int] = mapped_column(BigInteger)
    output_micros_per_mtok: Mapped[int] = mapped_column(BigInteger)
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
