"""The price book in memory: which price a usage record pays, and what it costs.

A record pays the price in force when it was created (``created_at``) of the most specific model
that has one then: its adapter, else its base model, else "*". The book is small (a row per price
change), so it is loaded whole per report; the usage side is aggregated in SQL by *segments*, the
intervals between consecutive ``effective_from`` times, inside which no price changes."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import datetime

WILDCARD = "*"


@dataclass(frozen=True)
class Rate:
    price_id: str
    model: str
    input: int  # micro-units per million tokens
    cached_input: int
    output: int
    effective_from: datetime


@dataclass(frozen=True)
class Cost:
    """One record's (or a sum's) cost by line item, in units of 10^-12 of the currency."""

    input: int = 0
    cached_input: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        return self.input + self.cached_input + self.output

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.input + other.input, self.cached_input + other.cached_input, self.output + other.output)


def cost_of(rate: Rate, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> Cost:
    cached = max(0, min(cached_tokens, prompt_tokens))
    return Cost(
        input=(prompt_tokens - cached) * rate.input,
        cached_input=cached * rate.cached_input,
        output=completion_tokens * rate.output,
    )


class PriceBook:
    def __init__(self, rates: list[Rate], currency: str | None) -> None:
        self.currency = currency
        self._by_model: dict[str, list[Rate]] = {}
        for r in sorted(rates, key=lambda r: r.effective_from):
            self._by_model.setdefault(r.model, []).append(r)
        # Every time a price changes, ascending: segment k starts at change k-1 (0: before any).
        self.changes: list[datetime] = sorted({r.effective_from for r in rates})

    def rate_at(self, model: str | None, at: datetime) -> Rate | None:
        rows = self._by_model.get(model) if model is not None else None
        if not rows:
            return None
        i = bisect.bisect_right([r.effective_from for r in rows], at)
        return rows[i - 1] if i else None

    def match(self, adapter: str | None, base_model: str | None, at: datetime) -> Rate | None:
        """Most specific first: the adapter's own price, its base model's, then "*"."""
        for model in (adapter, base_model, WILDCARD):
            found = self.rate_at(model, at)
            if found is not None:
                return found
        return None

    def segment_start(self, segment: int) -> datetime | None:
        """The time a segment starts (None: before the first price), for ``match``."""
        return self.changes[segment - 1] if segment > 0 else None

    def match_segment(self, adapter: str | None, base_model: str | None, segment: int) -> Rate | None:
        start = self.segment_start(segment)
        return None if start is None else self.match(adapter, base_model, start)
