"""The report as the JSON body of docs/api.md#get-v1usage and as CSV; amounts exact, never through
float."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any

from metering.kit.money import usd, usd_text
from metering.kit.timeutil import format_timestamp
from metering.reports.service import Bucket, Measures, Report

# The CSV columns (docs/architecture.md#usage-reports): one row per bucket and group.
CSV_MEASURES = ("requests", "input_tokens", "cache_read_tokens", "output_tokens")
_NO_GROUP: tuple[Any, ...] = ("", *(0 for _ in CSV_MEASURES), 0)
CSV_COLUMNS = {
    "model": ("starting_at", "ending_at", "model", *CSV_MEASURES, "cost_usd", "cost_microcents"),
    "api_key": (
        "starting_at",
        "ending_at",
        "api_key",
        "api_key_name",
        *CSV_MEASURES,
        "cost_usd",
        "cost_microcents",
    ),
    "project": (
        "starting_at",
        "ending_at",
        "project",
        "project_name",
        *CSV_MEASURES,
        "cost_usd",
        "cost_microcents",
    ),
    "member": (
        "starting_at",
        "ending_at",
        "member",
        "member_email",
        *CSV_MEASURES,
        "cost_usd",
        "cost_microcents",
    ),
}
# The groupings whose results name a group and its name, and the two members' names; their
# results' cost_usd is null (the microcents are exact), as the public API documents for keys.
_NAMED_GROUPS = {
    "api_key": ("api_key", "api_key_name"),
    "project": ("project", "project_name"),
    "member": ("member", "member_email"),
}


def _cost_members(billed: bool, with_usd: bool) -> Callable[[int], str]:
    """The two cost members of a JSON object, for an amount in microcents."""
    if not billed:
        return lambda cost: '"cost_usd":null,"cost_microcents":null'
    if with_usd:
        return lambda cost: f'"cost_usd":{usd(cost)},"cost_microcents":{cost}'
    return lambda cost: f'"cost_usd":null,"cost_microcents":{cost}'


def _members(
    requests: int, input_tokens: int, cache_read_tokens: int, output_tokens: int, cost: str
) -> str:
    """The measures' members of a JSON object (``cost``: its cost members)."""
    return (
        f'"requests":{requests},"input_tokens":{input_tokens},'
        f'"cache_read_tokens":{cache_read_tokens},"output_tokens":{output_tokens},{cost}'
    )


def _sums(sums: Measures, cost_members: Callable[[int], str]) -> str:
    return _members(
        sums["requests"],
        sums["input_tokens"],
        sums["cache_read_tokens"],
        sums["output_tokens"],
        cost_members(sums["cost_microcents"]),
    )


def _results(bucket: Bucket, opening: _Prefixes, cost_members: Callable[[int], str]) -> str:
    """A bucket's ``results`` objects, one per group."""
    rows = bucket.rows(
        "requests", "input_tokens", "cache_read_tokens", "output_tokens", "cost_microcents"
    )
    return ",".join(
        [
            f"{opening[key]}{_members(requests, inputs, cached, outputs, cost_members(cost))}}}"
            for key, requests, inputs, cached, outputs, cost in rows
        ]
    )


class _Prefixes(dict[str, str]):
    """Each group's opening ``{"model":…,`` text, written once per group and report."""

    def __init__(self, render: Callable[[str], str]) -> None:
        super().__init__()
        self.render = render

    def __missing__(self, key: str) -> str:
        text = self[key] = self.render(key)
        return text


def report_json(report: Report) -> bytes:
    """The JSON body, written directly as JSON text: a week of hours by 50 keys is 8,400 results,
    and this costs a fraction of building and encoding the equivalent dicts. Strings are escaped
    by the standard library's encoder, amounts are exact (``usd``), the text is ASCII."""
    query, billed = report.query, report.billed
    names = report.key_names
    named = _NAMED_GROUPS.get(query.group_by)
    if named is not None:
        # Per-group cost_usd is null, as the public API documents; the microcents are exact.
        # The service keys' group (group_by=member) is the member null.
        group, name = named
        prefixes = _Prefixes(
            lambda key: (
                f'{{"{group}":{_nullable(key or None)},"{name}":{_nullable(names.get(key))},'
            )
        )
        result_cost = _cost_members(billed, with_usd=False)
    else:
        prefixes = _Prefixes(lambda key: f'{{"model":{_string(key)},')
        result_cost = _cost_members(billed, with_usd=True)
    cost = _cost_members(billed, with_usd=True)
    buckets = []
    for bucket in report.buckets:
        buckets.append(
            f'{{"starting_at":"{format_timestamp(bucket.starting_at)}",'
            f'"ending_at":"{format_timestamp(bucket.ending_at)}",'
            f'{_sums(bucket.sums, cost)},"results":[{_results(bucket, prefixes, result_cost)}]}}'
        )
    head = (
        f'{{"object":"usage_report","bucket_width":{_string(query.bucket_width)},'
        f'"group_by":{_string(query.group_by)},'
        f'"cost_status":"{"billed" if billed else "not_applicable"}","currency":"usd",'
        f'"totals":{{{_sums(report.totals, cost)}}},"data":['
    )
    return (head + ",".join(buckets) + "]}").encode("ascii")


def _string(text: str) -> str:
    return encode_basestring_ascii(text)


def _nullable(text: str | None) -> str:
    return "null" if text is None else encode_basestring_ascii(text)


def report_csv(report: Report) -> str:
    """One row per bucket and group, buckets in time order, groups by key; an empty bucket is
    one row with empty group columns and zero counts. Cost columns are empty where the JSON
    report has null (per-key cost_usd; every cost of an unbilled account)."""
    query, billed = report.query, report.billed
    by_key = query.group_by in _NAMED_GROUPS
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS[query.group_by])
    for bucket in report.buckets:
        span = (format_timestamp(bucket.starting_at), format_timestamp(bucket.ending_at))
        # An empty bucket's one row: no group, every measure zero.
        rows = bucket.rows(*CSV_MEASURES, "cost_microcents") if bucket.groups else [_NO_GROUP]
        # (The service keys' group, by member, is the empty member.)
        for key, *counts, cost in rows:
            label = (key, report.key_names.get(key, "") if key else "") if by_key else (key,)
            cost_usd = usd_text(cost) if billed and not by_key else ""
            writer.writerow((*span, *label, *counts, cost_usd, cost if billed else ""))
    return out.getvalue()
