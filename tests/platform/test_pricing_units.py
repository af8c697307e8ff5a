"""The money arithmetic on its own: decimal rates to integer micro-units and back, the most
specific price at a time, segments, and exact costs (no float anywhere)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from loraplex.platform.errors import BadRequest
from loraplex.platform.pricing import money
from loraplex.platform.pricing.book import PriceBook, Rate, cost_of

T = datetime(2027, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("text", "micros"),
    [("0", 0), ("0.15", 150_000), ("2", 2_000_000), ("0.000001", 1), ("1000000", 10**12), ("12.5", 12_500_000)],
)
def test_rates_parse_to_exact_micro_units(text, micros):
    assert money.parse_rate(text, "p") == micros
    assert money.rate_text(micros) == (text if text != "12.5" else "12.5")


@pytest.mark.parametrize(
    "text", ["-1", "0.0000001", "1e3", "nan", "inf", "1,5", "", " ", "1000000.000001", "10000000", "0x10", ".5", "1."]
)
def test_bad_rates_are_refused(text):
    with pytest.raises(BadRequest) as e:
        money.parse_rate(text, "input_per_mtok")
    assert e.value.param == "input_per_mtok"


def test_cost_text_is_exact():
    assert money.cost_text(0) == "0"
    assert money.cost_text(1) == "0.000000000001"
    assert money.cost_text(150_000 * 1_000_000) == "0.15"  # a million tokens at 0.15
    assert money.cost_text(10**30 + 7) == "1000000000000000000.000000000007"


def _rate(pid, model, at, i=1, c=1, o=1):
    return Rate(pid, model, i, c, o, at)


def test_most_specific_price_in_force_wins():
    book = PriceBook(
        [
            _rate("star", "*", T),
            _rate("base1", "base", T + timedelta(days=1)),
            _rate("ad1", "bot", T + timedelta(days=2)),
            _rate("base2", "base", T + timedelta(days=3)),
        ],
        "USD",
    )
    assert book.match("bot", "base", T - timedelta(seconds=1)) is None  # before any price
    assert book.match("bot", "base", T).price_id == "star"
    assert book.match("bot", "base", T + timedelta(days=1)).price_id == "base1"
    assert book.match("bot", "base", T + timedelta(days=2)).price_id == "ad1"
    assert book.match("bot", "base", T + timedelta(days=4)).price_id == "ad1"  # the adapter's own stays
    assert book.match(None, "base", T + timedelta(days=4)).price_id == "base2"
    assert book.match("other", "base", T + timedelta(days=2)).price_id == "base1"
    assert book.match("other", None, T + timedelta(days=9)).price_id == "star"
    # a segment is priced by its start: the same answer as any time inside it
    assert book.changes == [T + timedelta(days=d) for d in range(4)]
    for seg in range(5):
        start = book.segment_start(seg)
        inside = (start or T) + timedelta(hours=12) if seg else T - timedelta(days=1)
        assert book.match_segment("bot", "base", seg) == book.match("bot", "base", inside)


def test_cost_is_integer_and_linear():
    rate = Rate("p", "*", input=150_000, cached_input=75_000, output=600_000, effective_from=T)
    one = cost_of(rate, prompt_tokens=1000, cached_tokens=256, completion_tokens=50)
    assert (one.input, one.cached_input, one.output) == (744 * 150_000, 256 * 75_000, 50 * 600_000)
    assert money.cost_text(one.total) == "0.0001608"  # (744*0.15 + 256*0.075 + 50*0.6) / 1e6
    # cached tokens never exceed the prompt
    assert cost_of(rate, 10, 99, 0).cached_input == 10 * 75_000 and cost_of(rate, 10, 99, 0).input == 0
    # summing tokens first or costs first gives the same integer
    parts = [cost_of(rate, p, c, o) for p, c, o in [(3, 1, 2), (17, 16, 5), (1, 0, 0)]]
    assert sum(x.total for x in parts) == cost_of(rate, 21, 17, 7).total
