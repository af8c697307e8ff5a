"""A budget amount as exact integer micro-units of its currency, from the decimal string of the API.

Refused (422): anything but a plain non-negative ASCII decimal with at most 6 digits after the
point — negative, NaN, Infinity, exponents ("1e3"), other scripts' digits ("١٢"), separators —
and amounts above ``MAX_AMOUNT``. The bound keeps every bookkeeping sum (units of 10^-12 of the
currency, ``pricing.money``) inside a signed 64-bit column on every database."""

from __future__ import annotations

import re

from loraplex.platform.errors import Unprocessable
from loraplex.platform.pricing.money import COST_DECIMALS

AMOUNT_DECIMALS = 6
MAX_AMOUNT = 1_000_000  # currency units per period (10^18 units of 10^-12: a BIGINT holds 9.2 x 10^18)
MAX_AMOUNT_MICROS = MAX_AMOUNT * 10**AMOUNT_DECIMALS
UNITS_PER_MICRO = 10 ** (COST_DECIMALS - AMOUNT_DECIMALS)

_DECIMAL = re.compile(r"^([0-9]{1,7})(?:\.([0-9]{1,6}))?$")


def parse_amount(text: object, param: str = "amount") -> int:
    if not isinstance(text, str):
        raise Unprocessable(f'{param} must be a decimal string such as "25.00"', param=param, code="invalid_amount")
    m = _DECIMAL.fullmatch(text)
    if m is None:
        raise Unprocessable(
            f"{param} must be a non-negative decimal string with at most {AMOUNT_DECIMALS} digits after the "
            "point (ASCII digits, no sign or exponent)",
            param=param,
            code="invalid_amount",
        )
    micros = int(m.group(1)) * 10**AMOUNT_DECIMALS + int((m.group(2) or "").ljust(AMOUNT_DECIMALS, "0"))
    if micros > MAX_AMOUNT_MICROS:
        raise Unprocessable(
            f"{param} is above the largest budget ({MAX_AMOUNT} per period)", param=param, code="invalid_amount"
        )
    return micros


def micros_to_units(micros: int) -> int:
    return micros * UNITS_PER_MICRO


def units_to_micros_ceil(units: int) -> int:
    """What an alert reports as ``used`` (integer micro-units, rounded up: never under-reports)."""
    return -(-units // UNITS_PER_MICRO)
