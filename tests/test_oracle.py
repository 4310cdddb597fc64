"""The price oracle (tests/oracle.py) against figures worked out by hand, never against the
service: if the oracle were wrong, every test and benchmark that checks money with it would
be wrong with it."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import oracle
from tests.oracle import Rates, Tokens, Version

GLM = (22_000_000, 339_000_000, 17_750_000)
HALF = (500_000, 500_000, 500_000)  # half a microcent per token, each component


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


# (what, tokens, rates, (input, cache read, output) µ¢ worked out by hand)
CHARGES: list[tuple[str, Tokens, tuple[int, int, int], tuple[int, int, int]]] = [
    # The README's example: 156 × 22 = 3,432; 4,352 × 17.75 = 77,248; 20 × 339 = 6,780.
    ("readme", Tokens(4508, 4352, 20, 16), GLM, (3432, 77_248, 6780)),
    # GLM-5.3's first version, 25 / 360 / 20 cents per million: 3,900; 87,040; 7,200.
    ("first version", Tokens(4508, 4352, 20, 16), (25_000_000, 360_000_000, 20_000_000),
     (3900, 87_040, 7200)),
    ("nothing", Tokens(0, 0, 0), GLM, (0, 0, 0)),
    # Each component rounds its own half: 0.5 + 0.5 + 0.5 is 3 µ¢ (rounded once, it were 2).
    ("three halves", Tokens(2, 1, 1), HALF, (1, 1, 1)),
    # 2.5 µ¢ rounds up to 3 (half-even would say 2); 1.5 to 2 (both would).
    ("2.5 up", Tokens(5, 0, 3), HALF, (3, 0, 2)),
    ("just below a half", Tokens(1, 0, 1), (499_999, 500_001, 0), (0, 0, 1)),
    ("2.5 µ¢ a token", Tokens(2, 1, 1), (2_500_000, 2_500_000, 2_500_000), (3, 3, 3)),
    # Qwen3.8-27B (0.95 / 3.8 / 0.2375 µ¢ a token): 1 × 0.95 = 0.95 → 1; 2 × 0.2375 = 0.475
    # → 0; 1 × 3.8 → 4. Then 6 × 0.95 = 5.7 → 6; 4 × 0.2375 = 0.95 → 1; 5 × 3.8 = 19.
    ("qwen small", Tokens(3, 2, 1), (950_000, 3_800_000, 237_500), (1, 0, 4)),
    ("qwen", Tokens(10, 4, 5), (950_000, 3_800_000, 237_500), (6, 1, 19)),
    # 37 × 1.234567 = 45.678979 → 46; 11 × 7.654321 = 84.197531 → 84.
    ("odd rates", Tokens(37, 0, 11), (1_234_567, 7_654_321, 3), (46, 0, 84)),
    # A whole context at GLM-5.3's first output rate: 1,048,576 × 360 = 377,487,360.
    ("a million tokens", Tokens(0, 0, 1_048_576), (0, 360_000_000, 0), (0, 0, 377_487_360)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tokens", "rates", "expected"), [c[1:] for c in CHARGES], ids=[c[0] for c in CHARGES]
)
def test_charges_worked_out_by_hand(
    tokens: Tokens, rates: tuple[int, int, int], expected: tuple[int, int, int]
) -> None:
    charge = oracle.charge(tokens, rates)
    assert (charge.input_microcents, charge.cache_read_microcents, charge.output_microcents) == (
        expected
    )
    assert charge.total_microcents == sum(expected)


def test_the_readme_example_as_the_ingest_answer_writes_it() -> None:
    assert oracle.charge(Tokens(4508, 4352, 20, 16), GLM).fields() == {
        "uncached_input_tokens": 156,
        "cache_read_tokens": 4352,
        "output_tokens": 20,
        "reasoning_tokens": 16,
        "input_microcents": 3432,
        "cache_read_microcents": 77_248,
        "output_microcents": 6780,
        "total_microcents": 87_460,
    }


# (api, usage object as that API returns it, normalised tokens)
USAGE: list[tuple[str, dict[str, Any], Tokens]] = [
    ("chat_completions",
     {"prompt_tokens": 4508, "completion_tokens": 20, "total_tokens": 4528,
      "prompt_tokens_details": {"cached_tokens": 4352},
      "completion_tokens_details": {"reasoning_tokens": 16}},
     Tokens(4508, 4352, 20, 16)),
    ("chat_completions", {"prompt_tokens": 37, "completion_tokens": 11}, Tokens(37, 0, 11, 0)),
    ("chat_completions",
     {"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": None,
      "completion_tokens_details": {"reasoning_tokens": None}, "extra": {"ignored": 1}},
     Tokens(5, 0, 2, 0)),
    ("responses",
     {"input_tokens": 80, "output_tokens": 7, "total_tokens": 87,
      "input_tokens_details": {"cached_tokens": 60},
      "output_tokens_details": {"reasoning_tokens": 6}},
     Tokens(80, 60, 7, 6)),
    # Messages: input_tokens already counts the cache reads; cache writes are not charged.
    ("messages",
     {"input_tokens": 1000, "output_tokens": 50, "cache_creation_input_tokens": 0,
      "cache_read_input_tokens": 400},
     Tokens(1000, 400, 50, 0)),
    ("messages", {"input_tokens": 278, "output_tokens": 54}, Tokens(278, 0, 54, 0)),
]  # fmt: skip


@pytest.mark.parametrize(("api", "usage", "tokens"), USAGE)
def test_usage_objects_are_normalised_as_the_reference_says(
    api: str, usage: dict[str, Any], tokens: Tokens
) -> None:
    assert oracle.tokens_of(api, usage) == tokens


def test_an_events_charge() -> None:
    # Responses at GLM-5.3: 20 × 22 = 440; 60 × 17.75 = 1,065; 7 × 339 = 2,373.
    event = {"api": "responses", "usage": USAGE[3][1]}
    assert oracle.event_charge(event, GLM).total_microcents == 440 + 1065 + 2373
    # Messages at DeepSeek-V4-Flash-0731-Fast (7 / 28 / 1.75 µ¢ a token): 600 × 7 = 4,200;
    # 400 × 1.75 = 700; 50 × 28 = 1,400.
    flash = oracle.catalog_prices("DeepSeek-V4-Flash-0731-Fast")[0].rates
    messages = {"api": "messages", "usage": USAGE[4][1]}
    assert oracle.event_charge(messages, flash).total_microcents == 4200 + 700 + 1400
    # The same messages event at GLM-5.3: 600 × 22 = 13,200; 400 × 17.75 = 7,100; 50 × 339 =
    # 16,950. Each event's charge is rounded on its own and then summed.
    assert oracle.total([event, messages, event], GLM) == 2 * 3878 + 13_200 + 7100 + 16_950


# (instant, GLM-5.3's rates from the catalog file in force then, or None)
GLM_IN_FORCE: list[tuple[datetime, Rates | None]] = [
    (utc(2026, 6, 15, 23, 59, 59, 999_999), None),
    (utc(2026, 6, 16), Rates(25_000_000, 360_000_000, 20_000_000)),
    (utc(2026, 8, 31, 23, 59, 59, 999_999), Rates(25_000_000, 360_000_000, 20_000_000)),
    (utc(2026, 9, 1), Rates(22_000_000, 339_000_000, 17_750_000)),  # at the instant: the new
    (utc(2026, 11, 29, 12), Rates(22_000_000, 339_000_000, 17_750_000)),
]


@pytest.mark.parametrize(("at", "rates"), GLM_IN_FORCE)
def test_the_catalog_files_price_in_force(at: datetime, rates: Rates | None) -> None:
    assert oracle.rates_at(oracle.catalog_prices("glm-5.3"), at) == rates


def test_the_readme_example_at_the_catalogs_price() -> None:
    rates = oracle.rates_at(oracle.catalog_prices("GLM-5.3"), utc(2026, 11, 29, 12))
    assert rates is not None
    assert oracle.charge(Tokens(4508, 4352, 20, 16), rates).total_microcents == 87_460


def test_an_accounts_own_rates_and_their_end() -> None:
    listed = [Version(utc(2026, 1, 1), Rates(*GLM))]
    own = [Version(utc(2026, 10, 1), Rates(1, 2, 3)), Version(utc(2026, 11, 1), None)]
    assert oracle.rates_at(listed, utc(2026, 9, 30), own) == Rates(*GLM)
    assert oracle.rates_at(listed, utc(2026, 10, 1), own) == Rates(1, 2, 3)
    assert oracle.rates_at(listed, utc(2026, 10, 31, 23), own) == Rates(1, 2, 3)
    assert oracle.rates_at(listed, utc(2026, 11, 1), own) == Rates(*GLM)  # the override ended
    assert oracle.rates_at([], utc(2026, 11, 1), own) is None


@given(tokens=st.integers(0, 10**12), rate=st.integers(0, 10**12))
def test_the_rounding_is_half_up_by_two_other_routes(tokens: int, rate: int) -> None:
    exact = Fraction(tokens * rate, oracle.TOKENS_PER_RATE)
    by_fraction = int(exact + Fraction(1, 2))  # floor, the value being non-negative
    by_decimal = int(
        (Decimal(tokens * rate) / oracle.TOKENS_PER_RATE).quantize(
            Decimal(1), rounding=ROUND_HALF_UP
        )
    )
    assert oracle.component(tokens, rate) == by_fraction == by_decimal


def test_the_oracle_imports_nothing_of_the_code_under_test() -> None:
    probe = (
        "import sys, tests.oracle\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'metering'))"
    )
    root = Path(oracle.__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
