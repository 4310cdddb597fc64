"""Request bodies for accounts and keys."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict

from metering.accounts.windows import SpendWindow
from metering.kit.money import LimitCentsInput
from metering.kit.text import PROBLEM, Text, storable

Name = Field(min_length=1, max_length=200)
# A model id as given (case-insensitive; checked against the catalog by the service).
ModelName = Annotated[Text, Field(min_length=1, max_length=200)]
# At most this many models in one list; requests in flight at most this many.
ModelList = Annotated[list[ModelName], Field(max_length=1000)]
ConcurrencyLimit = Annotated[int, Strict(), Field(ge=1, le=1_000_000)]


class AccountCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Text = Name
    billing: Literal["prepaid", "unbilled"] = "prepaid"


class AccountUpdate(BaseModel):
    """``PATCH /admin/v1/accounts/{id}``: omitted fields are unchanged."""

    model_config = ConfigDict(extra="forbid")

    # Omitted: unchanged (null is no name: refused).
    name: Text = Field(default=None, min_length=1, max_length=200)  # type: ignore[assignment]
    # null: no limit on requests in flight.
    max_concurrent_requests: ConcurrencyLimit | None = None
    # Null clears it (no credit.balance_low).
    low_balance_threshold_cents: LimitCentsInput | None = None


class ModelAccess(BaseModel):
    """``PUT /admin/v1/accounts/{id}/model-access``: null = every catalog model."""

    model_config = ConfigDict(extra="forbid")

    models: ModelList | None


class ApiKeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Text = Name
    # Cents with at most 6 decimals; null = no limit. Parsed exactly by ``parse_cents``.
    spend_limit_cents: LimitCentsInput | None = None
    spend_limit_window: SpendWindow = "month"
    # The older form: the limit per month (not with the two above).
    monthly_spend_limit_cents: LimitCentsInput | None = None
    # null: every model of the key's account.
    allowed_models: ModelList | None = None
    # Fixed for the key's life. Omitted: the account's ``Default`` project; no member: a
    # service key.
    project_id: Reference | None = None
    member_id: Reference | None = None


class ApiKeyUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Omitted: unchanged (null is no name: refused).
    name: Text = Field(default=None, min_length=1, max_length=200)  # type: ignore[assignment]
    spend_limit_cents: LimitCentsInput | None = None
    spend_limit_window: SpendWindow = "month"
    monthly_spend_limit_cents: LimitCentsInput | None = None
    allowed_models: ModelList | None = None


def _storable(value: str) -> str:
    if not storable(value):
        raise ValueError(PROBLEM)
    return value


# An id of the service named in a body (checked against the account by the service).
Reference = Annotated[Text, Field(min_length=1, max_length=64)]
# An email address as people write one: something, an @, a domain (no space or control
# character: an explicit range, read alike by every regex engine); compared case-insensitively.
# (Its own pattern excludes NUL, as Text's does: one pattern, in the schema and the check.)
Email = Annotated[
    str,
    # The constraints before the validator, so that the schema states them.
    Field(min_length=3, max_length=320, pattern=r"^[^@\x00-\x20]+@[^@\x00-\x20]+$"),
    AfterValidator(_storable),
]
Role = Literal["viewer", "developer", "admin"]


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Text = Name
    spend_limit_cents: LimitCentsInput | None = None
    spend_limit_window: SpendWindow = "month"
    # null: every model of the project's account.
    allowed_models: ModelList | None = None


class ProjectUpdate(BaseModel):
    """``PATCH /admin/v1/projects/{id}``: omitted fields are unchanged."""

    model_config = ConfigDict(extra="forbid")

    name: Text = Field(default=None, min_length=1, max_length=200)  # type: ignore[assignment]
    spend_limit_cents: LimitCentsInput | None = None
    spend_limit_window: SpendWindow = "month"
    allowed_models: ModelList | None = None


class MemberCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: Email
    name: Text = Field(default="", max_length=200)
    role: Role = "developer"
    spend_limit_cents: LimitCentsInput | None = None
    spend_limit_window: SpendWindow = "month"


class MemberUpdate(BaseModel):
    """``PATCH /admin/v1/members/{id}``: omitted fields are unchanged."""

    model_config = ConfigDict(extra="forbid")

    email: Email = None  # type: ignore[assignment]
    name: Text = Field(default=None, max_length=200)  # type: ignore[assignment]
    role: Role = None  # type: ignore[assignment]
    spend_limit_cents: LimitCentsInput | None = None
    spend_limit_window: SpendWindow = "month"
