"""What a request may cost (held at admission) and what it did cost (settled), at the price in
force when it was admitted (``pricing.book``: the adapter's price, else its base model's, else "*").

Worst case: every prompt token at the input price (the prefix cache's discount is only known once
served) plus ``n x max_tokens`` at the output price. Actual: ``pricing.book.cost_of`` — cached
prompt tokens at the cached price — the same arithmetic as the spend report.

A model with no price at all is free under the price book (the spend report counts it as
``unpriced_requests``, cost 0); a budget charges it nothing too, so it is admitted while the budget
is not already spent (docs/billing.md). Units: 10^-12 of the currency, exact integers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from loraplex.platform.pricing.book import Rate, cost_of


@dataclass(frozen=True)
class Priced:
    rate: Rate | None  # None: no price for this model
    currency: str | None  # the price book's (None: an empty book)


def price_for(session: Session, adapter_name: str | None, base_model: str | None, at: datetime) -> Priced:
    from loraplex.platform.pricing.service import load_book

    book = load_book(session)
    return Priced(book.match(adapter_name, base_model, at), book.currency)


def worst_case(rate: Rate | None, prompt_tokens: int, max_output_tokens: int) -> int:
    if rate is None:
        return 0
    return prompt_tokens * rate.input + max_output_tokens * rate.output


def actual_cost(hold: Any, prompt: int, cached: int, completion: int) -> int:
    """The cost of the tokens served, at the rates the hold recorded at admission."""
    rate = Rate(
        price_id="",
        model="",
        input=hold.input_micros_per_mtok,
        cached_input=hold.cached_input_micros_per_mtok,
        output=hold.output_micros_per_mtok,
        effective_from=hold.created_at,
    )
    return cost_of(rate, prompt, cached, completion).total
