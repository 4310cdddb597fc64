"""The money rules, pure: no database, no clock, no I/O. Everything else calls these."""

from metering.pricing.charge import Charge, Rates, component_microcents, price_usage
from metering.pricing.estimate import (
    Estimate,
    EstimateError,
    EstimateRequest,
    ModelLimits,
    default_output_limit,
    estimate_cost,
    field_beyond_range,
)
from metering.pricing.usage import (
    API_NAMES,
    MAX_TOKEN_COUNT,
    InvalidUsage,
    NormalizedUsage,
    normalize_usage,
)

__all__ = [
    "API_NAMES",
    "MAX_TOKEN_COUNT",
    "Charge",
    "Estimate",
    "EstimateError",
    "EstimateRequest",
    "InvalidUsage",
    "ModelLimits",
    "NormalizedUsage",
    "Rates",
    "component_microcents",
    "default_output_limit",
    "estimate_cost",
    "field_beyond_range",
    "normalize_usage",
    "price_usage",
]
