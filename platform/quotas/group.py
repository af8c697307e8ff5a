"""A prompt list (``/v1/completions`` with ``prompt`` as a list) is one engine request per prompt,
admitted whole or not at all.

``never_fits``: a list that no wait could ever admit (more prompts than ``max_concurrent`` or
``rpm``, more reserved tokens than ``tpm`` or the whole token budget) is a 400 naming the limit:
a 429 with ``Retry-After`` would make a client retry it forever. ``reserve_all``: the whole list
in one step (``QuotaStore.reserve_group``), so concurrent lists never each hold part of a limit
and starve one another; a store without it is driven one reservation at a time, giving back what
it held when one is refused."""

from __future__ import annotations

from typing import TYPE_CHECKING

from loraplex.platform.errors import BadRequest
from loraplex.platform.quotas.rule import RULE

if TYPE_CHECKING:
    from loraplex.platform.quotas.store import QuotaStore, QuotaView, Reservation


class NeverFits(BadRequest):
    code = "prompt_list_exceeds_limit"


def never_fits(scope: str, quota: QuotaView, tokens: list[int]) -> None:
    """Raise ``NeverFits`` if these requests can never be admitted together under ``quota``."""
    who = "this API key" if scope.startswith("key:") else "this tenant"
    count, total = len(tokens), sum(tokens)
    limits = (
        ("max_concurrent", quota.max_concurrent, count, f"{count} prompts", "requests at once"),
        ("rpm", quota.rpm, count, f"{count} prompts", "requests per minute"),
        ("tpm", quota.tpm, total, f"{total} tokens ({RULE} per prompt)", "tokens per minute"),
        (
            "token_budget",
            quota.token_budget,
            total,
            f"{total} tokens ({RULE} per prompt)",
            f"tokens per {quota.budget_period}",
        ),
    )
    for name, limit, need, needs, unit in limits:
        if limit is not None and need > limit:
            raise NeverFits(
                f"the prompt list needs {needs} but {who} is limited to {limit} {unit} ({name}): "
                "it can never be admitted whole; send fewer prompts per request or lower max_tokens or n",
                param="prompt",
            )


def reserve_all(store: QuotaStore, scope: str, quota: QuotaView, tokens: list[int]) -> list[Reservation]:
    """Hold every one of ``tokens`` under ``scope`` (a tenant, or ``key:<id>``), or none."""
    if len(tokens) > 1:
        never_fits(scope, quota, tokens)
    group = getattr(store, "reserve_group", None)
    if group is not None:
        return list(group(scope, quota, tokens))
    held: list[Reservation] = []
    try:
        for t in tokens:
            held.append(store.reserve(scope, quota, t))
    except BaseException:
        for res in held:
            store.cancel(res)
        raise
    return held
