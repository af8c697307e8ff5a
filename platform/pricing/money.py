"""Exact money: rates are integer micro-units per million tokens, costs integer units of
10^-12 of the currency (tokens x micro-units per million tokens). No float touches an amount;
decimal text in, decimal text out."""

from __future__ import annotations

import re

from loraplex.platform.errors import BadRequest

RATE_DECIMALS = 6  # a rate is given to at most a millionth of the currency per million tokens
COST_DECIMALS = 12  # tokens x (10^-6 / 10^6 tokens): a cost is exact in units of 10^-12
MAX_RATE_MICROS = 10**6 * 10**RATE_DECIMALS  # one million currency units per million tokens

# ASCII digits only: Python's \d also matches other scripts' digits ("١٢" would be 12).
_DECIMAL = re.compile(r"^([0-9]{1,7})(?:\.([0-9]{1,6}))?$")


def parse_rate(text: str, param: str) -> int:
    """A non-negative decimal string ("0.15", "2", "0.000001") as integer micro-units."""
    if not isinstance(text, str):
        raise BadRequest(f'{param} must be a decimal string such as "0.15"', param=param)
    m = _DECIMAL.match(text.strip())
    if m is None:
        raise BadRequest(
            f"{param} must be a non-negative decimal with at most {RATE_DECIMALS} digits after the point",
            param=param,
        )
    whole, frac = m.group(1), (m.group(2) or "")
    micros = int(whole) * 10**RATE_DECIMALS + int(frac.ljust(RATE_DECIMALS, "0"))
    if micros > MAX_RATE_MICROS:
        raise BadRequest(f"{param} is above the largest rate (1000000 per million tokens)", param=param)
    return micros


def fixed(units: int, decimals: int) -> str:
    """Integer ``units`` of 10^-decimals as exact decimal text, trailing zeros dropped ("0.15", "2")."""
    sign = "-" if units < 0 else ""
    whole, frac = divmod(abs(units), 10**decimals)
    digits = str(frac).rjust(decimals, "0").rstrip("0")
    return f"{sign}{whole}.{digits}" if digits else f"{sign}{whole}"


def rate_text(micros: int) -> str:
    return fixed(micros, RATE_DECIMALS)


def cost_text(units: int) -> str:
    return fixed(units, COST_DECIMALS)


def cost_number(units: int) -> float:
    """OpenAI's Costs API carries ``amount.value`` as a JSON number: the exact amount rounded to the
    nearest double, for display only (``amount.value_exact`` keeps the exact text)."""
    return float(cost_text(units))
