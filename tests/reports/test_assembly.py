"""Rollup rows → complete buckets → the JSON body and the CSV, without a database."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from metering.reports.params import ReportQuery
from metering.reports.render import report_csv, report_json
from metering.reports.service import (
    MEASURES,
    Bucket,
    Measures,
    Report,
    RollupRows,
    assemble,
    totals,
)

# (bucket index, group key, requests, input, cache read and output tokens, cost)
Row = tuple[int, str, int, int, int, int, int]


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def query(group_by: str = "model", width: str = "1d", days: int = 3) -> ReportQuery:
    start = utc(2026, 11, 1)
    step = timedelta(days=1) if width == "1d" else timedelta(hours=1)
    return ReportQuery(start, start + days * step, width, group_by, None, None, "json")


def read(rows: list[Row]) -> RollupRows:
    """The rows as the report reads them: by bucket, by group, the values of MEASURES."""
    found: dict[int, dict[str, tuple[int, ...]]] = {}
    for bucket, group, *values in rows:
        found.setdefault(bucket, {})[group] = tuple(values)
    return found


def report(
    q: ReportQuery,
    rows: list[Row],
    billed: bool = True,
    key_names: dict[str, str] | None = None,
) -> Report:
    buckets = assemble(q, read(rows))
    return Report(q, billed, totals(buckets), buckets, key_names or {})


def m(
    requests: int, input_tokens: int, cache_read_tokens: int, output_tokens: int, cost: int
) -> Measures:
    return Measures(
        requests=requests,
        input_tokens=input_tokens,
        cache_read_tokens=cache_read_tokens,
        output_tokens=output_tokens,
        cost_microcents=cost,
    )


def results(bucket: Bucket) -> dict[str, dict[str, int]]:
    """Each group's measures, by name, from the bucket's columns."""
    return {
        key: {name: bucket.columns[name][index] for name in MEASURES}
        for index, key in enumerate(bucket.groups)
    }


def body_of(r: Report) -> Any:
    """The body as a client parses it; decimals kept as their text, to compare exactly."""
    return json.loads(report_json(r), parse_float=str)


ROWS = [
    # out of order on purpose: assembly orders buckets by time and groups by key
    (2, "glm-5.3", 1, 10, 2, 5, 7),
    (0, "b-model", 2, 200, 100, 20, 123_456_789),
    (0, "B-model", 1, 100, 0, 10, 1),
    (0, "GLM-5.3", 3, 300, 30, 3, 100_000_000),
]


class TestAssemble:
    def test_every_bucket_in_time_order_with_groups_in_byte_order(self) -> None:
        buckets = assemble(query(), read(ROWS))
        assert [b.starting_at for b in buckets] == [utc(2026, 11, d) for d in (1, 2, 3)]
        assert [b.ending_at for b in buckets] == [utc(2026, 11, d) for d in (2, 3, 4)]
        # upper case before lower case, as COLLATE "C"
        assert buckets[0].groups == ("B-model", "GLM-5.3", "b-model")
        assert buckets[0].sums == m(6, 600, 130, 33, 223_456_790)
        assert results(buckets[1]) == {} and buckets[1].sums == m(0, 0, 0, 0, 0)
        assert results(buckets[2]) == {"glm-5.3": m(1, 10, 2, 5, 7)}

    def test_non_ascii_keys_sort_by_utf8_bytes(self) -> None:
        names = ["é", "z", "\u4e2d", "Z", "~", "\U0001f600"]
        rows: list[Row] = [(0, name, 1, 0, 0, 0, 0) for name in names]
        keys = assemble(query(days=1), read(rows))[0].groups
        assert list(keys) == sorted(names, key=str.encode)

    def test_a_label_merges_groups(self) -> None:
        hidden = {"b-model", "GLM-5.3"}
        buckets = assemble(query(), read(ROWS), lambda m: "unavailable" if m in hidden else m)
        assert list(results(buckets[0]).items()) == [
            ("B-model", m(1, 100, 0, 10, 1)),
            ("unavailable", m(5, 500, 130, 23, 223_456_789)),
        ]

    def test_totals(self) -> None:
        r = report(query(), ROWS)
        assert r.totals == m(7, 610, 132, 38, 223_456_797)


class TestJsonBody:
    def test_group_by_model(self) -> None:
        body = body_of(report(query(days=2), ROWS[1:]))
        assert body == {
            "object": "usage_report",
            "bucket_width": "1d",
            "group_by": "model",
            "cost_status": "billed",
            "currency": "usd",
            "totals": {
                "requests": 6,
                "input_tokens": 600,
                "cache_read_tokens": 130,
                "output_tokens": 33,
                "cost_usd": "2.2345679",
                "cost_microcents": 223_456_790,
            },
            "data": [
                {
                    "starting_at": "2026-11-01T00:00:00Z",
                    "ending_at": "2026-11-02T00:00:00Z",
                    "requests": 6,
                    "input_tokens": 600,
                    "cache_read_tokens": 130,
                    "output_tokens": 33,
                    "cost_usd": "2.2345679",
                    "cost_microcents": 223_456_790,
                    "results": [
                        {
                            "model": "B-model",
                            "requests": 1,
                            "input_tokens": 100,
                            "cache_read_tokens": 0,
                            "output_tokens": 10,
                            "cost_usd": "0.00000001",
                            "cost_microcents": 1,
                        },
                        {
                            "model": "GLM-5.3",
                            "requests": 3,
                            "input_tokens": 300,
                            "cache_read_tokens": 30,
                            "output_tokens": 3,
                            "cost_usd": 1,  # an integral amount is written without a point
                            "cost_microcents": 100_000_000,
                        },
                        {
                            "model": "b-model",
                            "requests": 2,
                            "input_tokens": 200,
                            "cache_read_tokens": 100,
                            "output_tokens": 20,
                            "cost_usd": "1.23456789",
                            "cost_microcents": 123_456_789,
                        },
                    ],
                },
                {
                    "starting_at": "2026-11-02T00:00:00Z",
                    "ending_at": "2026-11-03T00:00:00Z",
                    "requests": 0,
                    "input_tokens": 0,
                    "cache_read_tokens": 0,
                    "output_tokens": 0,
                    "cost_usd": 0,
                    "cost_microcents": 0,
                    "results": [],
                },
            ],
        }

    def test_cost_is_an_exact_json_number(self) -> None:
        raw = report_json(report(query(days=1), ROWS[1:2])).decode()
        assert '"cost_usd":1.23456789,"cost_microcents":123456789' in raw

    def test_group_by_api_key(self) -> None:
        rows: list[Row] = [
            (1, "key_b", 1, 5, 1, 2, 30),
            (0, "key_a", 2, 7, 0, 1, 12),
            (1, "key_a", 1, 1, 1, 1, 1),
        ]
        q = query("api_key", "1h", 2)
        body = body_of(report(q, rows, key_names={"key_a": "ci", "key_b": "prod"}))
        assert body["group_by"] == "api_key" and body["bucket_width"] == "1h"
        assert body["totals"]["cost_usd"] == "0.00000043"
        assert body["totals"]["cost_microcents"] == 43
        second = body["data"][1]
        assert (second["starting_at"], second["ending_at"]) == (
            "2026-11-01T01:00:00Z",
            "2026-11-01T02:00:00Z",
        )
        assert (second["cost_usd"], second["cost_microcents"]) == ("0.00000031", 31)
        assert second["results"] == [
            {
                "api_key": "key_a",
                "api_key_name": "ci",
                "requests": 1,
                "input_tokens": 1,
                "cache_read_tokens": 1,
                "output_tokens": 1,
                "cost_usd": None,
                "cost_microcents": 1,
            },
            {
                "api_key": "key_b",
                "api_key_name": "prod",
                "requests": 1,
                "input_tokens": 5,
                "cache_read_tokens": 1,
                "output_tokens": 2,
                "cost_usd": None,
                "cost_microcents": 30,
            },
        ]

    def test_unbilled_has_no_cost_anywhere(self) -> None:
        for group_by in ("model", "api_key"):
            body = body_of(report(query(group_by), ROWS, billed=False, key_names={}))
            assert body["cost_status"] == "not_applicable"
            measures = [body["totals"], *body["data"]]
            measures += [r for b in body["data"] for r in b["results"]]
            assert len(measures) == 1 + 3 + 4
            for item in measures:
                assert (item["cost_usd"], item["cost_microcents"]) == (None, None)
            assert body["totals"]["requests"] == 7


def csv_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


class TestCsv:
    def test_group_by_model(self) -> None:
        text = report_csv(report(query(days=3), ROWS))
        assert text.endswith("\r\n")
        assert csv_rows(text) == [
            [
                "starting_at",
                "ending_at",
                "model",
                "requests",
                "input_tokens",
                "cache_read_tokens",
                "output_tokens",
                "cost_usd",
                "cost_microcents",
            ],
            [
                "2026-11-01T00:00:00Z",
                "2026-11-02T00:00:00Z",
                "B-model",
                "1",
                "100",
                "0",
                "10",
                "0.00000001",
                "1",
            ],
            [
                "2026-11-01T00:00:00Z",
                "2026-11-02T00:00:00Z",
                "GLM-5.3",
                "3",
                "300",
                "30",
                "3",
                "1",
                "100000000",
            ],
            [
                "2026-11-01T00:00:00Z",
                "2026-11-02T00:00:00Z",
                "b-model",
                "2",
                "200",
                "100",
                "20",
                "1.23456789",
                "123456789",
            ],
            ["2026-11-02T00:00:00Z", "2026-11-03T00:00:00Z", "", "0", "0", "0", "0", "0", "0"],
            [
                "2026-11-03T00:00:00Z",
                "2026-11-04T00:00:00Z",
                "glm-5.3",
                "1",
                "10",
                "2",
                "5",
                "0.00000007",
                "7",
            ],
        ]

    def test_group_by_api_key(self) -> None:
        rows: list[Row] = [(0, "key_a", 2, 7, 0, 1, 12)]
        text = report_csv(report(query("api_key", days=2), rows, key_names={"key_a": 'a, "b"'}))
        assert csv_rows(text) == [
            [
                "starting_at",
                "ending_at",
                "api_key",
                "api_key_name",
                "requests",
                "input_tokens",
                "cache_read_tokens",
                "output_tokens",
                "cost_usd",
                "cost_microcents",
            ],
            [
                "2026-11-01T00:00:00Z",
                "2026-11-02T00:00:00Z",
                "key_a",
                'a, "b"',
                "2",
                "7",
                "0",
                "1",
                "",
                "12",
            ],
            ["2026-11-02T00:00:00Z", "2026-11-03T00:00:00Z", "", "", "0", "0", "0", "0", "", "0"],
        ]

    def test_unbilled_cost_columns_are_empty(self) -> None:
        rows = csv_rows(report_csv(report(query(days=1), ROWS[1:2], billed=False)))
        assert rows[1][-2:] == ["", ""]
