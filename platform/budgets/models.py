from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from loraplex.platform.db.base import Base, UTCDateTime, utcnow


class Budget(Base):
    """A cap in currency on one tenant, project or key, per period in the budget's own timezone.

    ``spent_units`` and ``reserved_units`` are the current window's bookkeeping (``window_start``):
    settled costs and the worst-case costs of admitted requests still running, both in units of
    10^-12 of the currency (exact, like ``pricing.money``). They are changed only under the row's
    lock (``budgets/store.py``), so every server on the database admits against the same numbers.
    No foreign key: ``scope_id`` names a tenant, a project or a key (``owners.py`` checks it)."""

    __tablename__ = "budgets"

    scope: Mapped[str] = mapped_column(String(8), primary_key=True)  # tenant | project | key
    scope_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(40), index=True)  # the owning tenant (every scope)
    amount_micros: Mapped[int] = mapped_column(BigInteger)  # millionths of the currency
    currency: Mapped[str] = mapped_column(String(3))
    period: Mapped[str] = mapped_column(String(8))  # daily | weekly | monthly | total
    timezone: Mapped[str] = mapped_column(String(64))  # IANA name, checked with zoneinfo
    window_start: Mapped[datetime] = mapped_column(UTCDateTime())
    spent_units: Mapped[int] = mapped_column(BigInteger, default=0)
    reserved_units: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_by: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class BudgetHold(Base):
    """One admitted engine request's worst-case cost held against one budget until it settles.

    The row is the reservation: settling deletes it and moves its amount from ``reserved_units`` to
    the actual cost in ``spent_units`` in one transaction, so a settle sent twice (or by a recovery
    and a late process) applies once. ``instance_id`` is the server that admitted it: when that
    server's lease expires (killed), another server settles its holds from the usage ledger
    (``store.recover_dead``). The rates are the price in force at admission, which the settle uses."""

    __tablename__ = "budget_holds"
    __table_args__ = (Index("ix_budget_holds_scope", "scope", "scope_id"),)

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    scope: Mapped[str] = mapped_column(String(8), primary_key=True)
    scope_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    window_start: Mapped[datetime] = mapped_column(UTCDateTime())
    amount_units: Mapped[int] = mapped_column(BigInteger)
    input_micros_per_mtok: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_input_micros_per_mtok: Mapped[int] = mapped_column(BigInteger, default=0)
    output_micros_per_mtok: Mapped[int] = mapped_column(BigInteger, default=0)
    instance_id: Mapped[str] = mapped_column(String(32), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
