"""Integer microcents and their exact decimal renderings. No float ever touches an amount.

1 cent = 1,000,000 microcents; 1 USD = 100,000,000 microcents.
"""

from __future__ import annotations

from decimal import Context, Decimal, Inexact
from typing import Annotated

from pydantic import Strict, WithJsonSchema

from metering.kit.errors import InvalidRequest

MICROCENTS_PER_CENT = 1_000_000
MICROCENTS_PER_USD = 100_000_000
CENTS_DECIMALS = 6
USD_DECIMALS = 8
# Money inputs beyond ±9×10^12 cents are refused (docs/api.md#conventions; 9×10^18 microcents still
# fits a signed 64-bit column).
MAX_INPUT_CENTS = 9 * 10**12
INT64_MAX = 2**63 - 1
# Scaling a money input to microcents must never round: the default context keeps 28 digits and
# flushes tiny exponents to zero, which would accept e.g. 1.00000000000000000000000000001 cents.
_EXACT = Context(prec=40, traps=[Inexact])


# A money input as the exact JSON parser hands it over: an int, or a Decimal for a JSON number with
# a fraction. Strings and booleans are refused; ``parse_cents`` then checks decimals and range.
_Cents = Annotated[int, Strict()] | Annotated[Decimal, Strict()]


def _cents_schema(**bounds: object) -> WithJsonSchema:
    """A money input's schema: a JSON number (never a string) within its bounds. At most 6
    decimals is the rule too, which JSON Schema's binary ``multipleOf`` cannot state exactly."""
    return WithJsonSchema(
        {
            "type": "number",
            "description": "cents, with at most 6 decimals",
            "minimum": -MAX_INPUT_CENTS,
            "maximum": MAX_INPUT_CENTS,
            **bounds,
        }
    )


# A signed amount (an adjustment: not 0).
CentsInput = Annotated[_Cents, _cents_schema(**{"not": {"const": 0}})]
# A positive amount (a grant).
PositiveCentsInput = Annotated[_Cents, _cents_schema(exclusiveMinimum=0)]
# A limit or a threshold (0 or more).
LimitCentsInput = Annotated[_Cents, _cents_schema(minimum=0)]


class ExactNumber(str):
    """A JSON number written verbatim (plain notation) by ``metering.kit.jsonenc``.

    Only constructed from integers by the functions below, so its text is always a valid number.
    """

    __slots__ = ()


def round_half_up_div(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded to the nearest integer, halves towards +infinity.

    The one rounding function of the service: every charge component and rate rounding uses it.
    """
    if denominator <= 0:
        raise ValueError("denominator must be positive")
    return (2 * numerator + denominator) // (2 * denominator)


def scaled_text(value: int, decimals: int) -> str:
    """``value / 10**decimals`` as exact plain decimal text without trailing zeros."""
    if decimals == 0:
        return str(value)
    sign = "-" if value < 0 else ""
    digits = str(abs(value)).rjust(decimals + 1, "0")
    whole, frac = digits[:-decimals], digits[-decimals:].rstrip("0")
    return f"{sign}{whole}.{frac}" if frac else f"{sign}{whole}"


def cents(microcents: int) -> ExactNumber:
    """Microcents rendered as an exact JSON number of cents (``87460`` → ``0.08746``)."""
    return ExactNumber(scaled_text(microcents, CENTS_DECIMALS))


def usd(microcents: int) -> ExactNumber:
    """Microcents rendered as an exact JSON number of US dollars (``87460`` → ``0.0008746``)."""
    return ExactNumber(scaled_text(microcents, USD_DECIMALS))


def usd_text(microcents: int) -> str:
    """The same exact dollars as plain text, for CSV and Parquet."""
    return scaled_text(microcents, USD_DECIMALS)


def whole_cents(rate_microcents: int) -> int:
    """A rate rounded to whole cents, halves up (the card's ``*_cents_per_million``)."""
    return round_half_up_div(rate_microcents, MICROCENTS_PER_CENT)


def is_whole_cents(microcents: int) -> bool:
    return microcents % MICROCENTS_PER_CENT == 0


def parse_cents(value: object, param: str, *, allow_negative: bool = False) -> int:
    """An ``amount_cents``-style input (int or Decimal from the JSON parser) to microcents.

    At most 6 decimals, finite, within ±9×10^12 cents; anything else is a 400 naming ``param``.
    """
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        raise InvalidRequest(f"{param} must be a number of cents", param=param)
    amount = Decimal(value)
    if not amount.is_finite():
        raise InvalidRequest(f"{param} must be a finite number", param=param)
    if amount.copy_abs() > MAX_INPUT_CENTS:  # exact: abs() rounds, and overflows on 1E+999999999
        raise InvalidRequest(
            f"{param} must be between -{MAX_INPUT_CENTS} and {MAX_INPUT_CENTS} cents", param=param
        )
    try:
        scaled = amount.scaleb(CENTS_DECIMALS, context=_EXACT)
        whole = scaled == scaled.to_integral_value()
    except Inexact:  # more significant digits than any valid amount has
        whole = False
    if not whole:
        raise InvalidRequest(f"{param} may have at most 6 decimals", param=param)
    microcents = int(scaled)
    if microcents < 0 and not allow_negative:
        raise InvalidRequest(f"{param} must not be negative", param=param)
    return microcents
