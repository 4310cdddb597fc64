"""The benchmark harness itself (``make bench``, ``make bench-compare``): one table of every
figure, and figures that cannot be reported as met wrongly. The real benchmarks take minutes and
need a quiet machine, so here they run small (a second of load, a few accounts) against real
server processes and PostgreSQL: a healthy service gives figures without problems, and a
deliberately broken one — a gateway token that no longer matches, every event quarantined, books
that do not reconcile — makes the affected figures "not met", whatever their numbers."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

import bench
from bench import __main__ as runner
from bench import bench_citus, bench_ingest, bench_ledger, bench_webhooks, compare
from bench import common as bench_common
from bench.common import CodeUnderTest, Result, bench_database, libpq_url, sql_scalar
from tests.conftest import CITUS, CITUS_MAINTENANCE_URL

# Real server processes on PostgreSQL (the harness measures nothing else).
needs_postgresql = pytest.mark.usefixtures("needs_postgresql")

LEDGER_SMALL: dict[str, Any] = {
    "seconds": 0.5,
    "warmup": 0.3,
    "rounds": 1,
    "workers": 1,
    "accounts": 3,
    "spread_clients": 4,
    "latency_clients": 2,
    "hot_clients": 4,
}
INGEST_SMALL: dict[str, Any] = {
    "seconds": 0.5,
    "warmup": 0.3,
    "rounds": 1,
    "workers": 1,
    "senders": 2,
    "batch": 50,
    "accounts": 2,
    "copy_rows": 2000,
}
LEDGER_FIGURES = [
    "ledger.spread",
    "ledger.p99",
    "ledger.hot",
    "ledger.hot_voids",
    "ledger.half_refused",
    "ledger.layered",
]
INGEST_FIGURES = ["ingest.batches", "ingest.singles", "ingest.rss"]


def sql(url: str, statement: str) -> None:
    with psycopg.connect(libpq_url(url)) as connection:
        connection.execute(statement)


def by_name(results: list[Result]) -> dict[str, Result]:
    return {result.name: result for result in results}


def test_every_benchmark_module_is_run_by_make_bench() -> None:
    names = sorted(
        m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")
    )
    assert names == [
        "bench_citus",
        "bench_embedded",
        "bench_gateway",
        "bench_ingest",
        "bench_ledger",
        "bench_refusals",
        "bench_reports",
        "bench_webhooks",
    ]
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        assert callable(module.run) and callable(module.Config), name
    with pytest.raises(SystemExit, match="no such benchmark: legder"):
        runner.modules(["legder"])


def test_the_harness_never_imports_the_code_under_test() -> None:
    """It drives the service only as an operator and a gateway do, so it measures any checkout
    (``bench.compare`` points it at an older one) and shares no bug with it. Of the tests it
    imports the price oracle alone, which imports nothing of the service."""
    probe = (
        "import sys, bench.__main__, bench.compare, bench.bench_ledger, bench.bench_ingest, "
        "bench.bench_reports, bench.bench_embedded, bench.bench_citus, bench.bench_webhooks, "
        "bench.bench_gateway, bench.bench_refusals, bench.baseline_app\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('metering', 'tests')))"
    )
    root = Path(bench.__file__).parent.parent
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "['tests', 'tests.oracle']"


def test_a_figure_with_problems_is_not_met_whatever_its_number() -> None:
    def result(target_met: bool | None, problems: tuple[str, ...] = ()) -> Result:
        return Result("x", "x/s", ">= 10/s", 99.0, "/s", target_met, "1 round", problems=problems)

    assert (result(True).met, result(False).met, result(None).met) == (True, False, None)
    assert result(True, ("401",)).met is False
    assert result(None, ("401",)).met is False


def test_one_table_with_every_figure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = ModuleType("bench.bench_standin")
    results = [
        Result("s.a", "events/s", ">= 20000/s", 3986.4, "/s", False, "median of 3 rounds",
               "3% of bare COPY"),
        Result("s.b", "p99 latency", "<= 10 ms", 8.0, "ms", True, "median of 3 rounds",
               "bare FastAPI p99 6 ms", 6.0, higher_is_better=False),
        Result("s.c", "peak RSS", "<= 300 MB", 140.2, "MB", True, "peak over 3 rounds",
               problems=("ours: 3 of 9 operations failed, e.g. batch: 500",)),
        Result("s.d", "informational", "-", 12.0, "/s", None, "1 round"),
    ]  # fmt: skip
    configs: list[object] = []

    class Config:
        def __init__(self, code: CodeUnderTest) -> None:
            configs.append(code)

    fake.Config = Config  # type: ignore[attr-defined]
    fake.run = lambda config: results  # type: ignore[attr-defined]
    (tmp_path / "bench_standin.py").write_text("")
    monkeypatch.setattr(bench, "__path__", [*bench.__path__, str(tmp_path)])
    monkeypatch.setitem(sys.modules, "bench.bench_standin", fake)
    out = tmp_path / "results.json"

    code = runner.main(["standin", "--json", str(out), "--code", str(tmp_path)])

    assert configs == [CodeUnderTest(tmp_path)]  # the checkout to measure reaches the module
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["figure", "target", "measured", "met", "statistic", "in-run baseline"]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert rows == [
        ["events/s", ">= 20000/s", "3,986.4 /s", "NO", "median of 3 rounds", "3% of bare COPY"],
        ["p99 latency", "<= 10 ms", "8.0 ms", "yes", "median of 3 rounds",
         "bare FastAPI p99 6 ms"],
        ["peak RSS", "<= 300 MB", "140.2 MB", "NO (errors)", "peak over 3 rounds", ""],
        ["informational", "-", "12.0 /s", "-", "1 round", ""],
    ]  # fmt: skip
    assert "NOT MET s.c: ours: 3 of 9 operations failed, e.g. batch: 500" in printed
    assert "Machine: " in printed and "cores" in printed and "load average" in printed
    assert code == 1  # a target not met fails the run
    saved = json.loads(out.read_text())
    assert [r["met"] for r in saved["results"]] == [False, True, False, None]
    assert saved["results"][1]["ceiling"] == 6.0


@needs_postgresql
class TestLedger:
    def test_a_healthy_service_gives_every_figure_without_problems(self) -> None:
        results = bench_ledger.run(bench_ledger.Config(**LEDGER_SMALL))
        assert [r.name for r in results] == LEDGER_FIGURES
        for result in results:
            assert result.problems == (), result
            assert result.measured > 0 and result.ceiling, result
            assert result.statistic == "1 round"
        p99 = by_name(results)["ledger.p99"]
        assert (p99.target, p99.unit, p99.higher_is_better) == ("<= 10 ms", "ms", False)

    def test_a_gateway_token_that_no_longer_matches_fails_every_figure(self) -> None:
        """Every authorization 401 (fast ones, too): no figure is met."""
        code = CodeUnderTest(server_env=(("METERING_GATEWAY_TOKENS", "rotated-away"),))
        results = bench_ledger.run(bench_ledger.Config(**LEDGER_SMALL, code=code))
        assert [r.name for r in results] == LEDGER_FIGURES
        for result in results:
            assert result.met is False, result
            assert any("authorization: 401, expected 200" in p for p in result.problems), result

    def test_a_price_not_the_one_set_fails_the_figures_of_what_it_charged(self) -> None:
        """The service charges its settlements at a rate the harness never set (its books
        still reconcile): the hot account's balance is not its grants less the oracle's
        charges, and every figure checked from then on is not met."""

        def reprice(url: str) -> None:
            sql(url, "UPDATE price_versions SET output_microcents_per_million = 340000000")

        config = bench_ledger.Config(**LEDGER_SMALL, after_round=reprice)
        results = by_name(bench_ledger.run(config))
        for name in ("ledger.hot", "ledger.hot_voids", "ledger.half_refused"):
            problems = results[name].problems
            assert results[name].met is False, results[name]
            assert any("the grants less the oracle's charges" in p for p in problems), problems
            assert not any("metering verify" in p for p in problems), problems
        assert results["ledger.spread"].problems == ()  # nothing was settled before

    def test_a_limit_not_enforced_fails_the_layered_figure(self) -> None:
        """The projects' limits lifted behind the service's back: (e)'s probes find the
        authorizations they must refuse granted (or refused by a later limit), and its figure
        is not met; the others are unaffected."""

        def lift(url: str) -> None:
            sql(url, "UPDATE projects SET spend_limit_microcents = NULL")

        results = by_name(bench_ledger.run(bench_ledger.Config(**LEDGER_SMALL, after_setup=lift)))
        layered = results["ledger.layered"]
        assert layered.met is False, layered
        assert any("expected 402 project_spend_limit (project)" in p for p in layered.problems), (
            layered.problems
        )
        assert results["ledger.spread"].problems == ()

    def test_books_that_do_not_reconcile_fail_the_figures(self) -> None:
        def break_a_balance(url: str) -> None:
            sql(url, "UPDATE accounts SET balance_microcents = balance_microcents + 1")

        config = bench_ledger.Config(**LEDGER_SMALL, after_round=break_a_balance)
        results = bench_ledger.run(config)
        for result in results:
            assert result.met is False, result
            assert any(
                p.startswith("metering verify exited 1") and "MISMATCH" in p
                for p in result.problems
            ), result


@needs_postgresql
class TestIngest:
    def test_a_healthy_service_gives_every_figure_without_problems(self) -> None:
        results = bench_ingest.run(bench_ingest.Config(**INGEST_SMALL))
        assert [r.name for r in results] == INGEST_FIGURES
        for result in results:
            assert result.problems == (), result
            assert result.measured > 0, result
        rss = by_name(results)["ingest.rss"]
        assert (rss.target, rss.unit, rss.higher_is_better) == ("<= 300 MB", "MB", False)
        assert rss.met is True  # a small server process, far below its target

    def test_a_price_not_the_one_set_fails_the_ingest_figures(self) -> None:
        """Every event charged at a rate the harness never set: the books reconcile, but no
        account's balance is its grants less the oracle's charges."""

        def reprice(url: str) -> None:
            sql(url, "UPDATE price_versions SET input_microcents_per_million = 23000000")

        config = bench_ingest.Config(**INGEST_SMALL, after_setup=reprice)
        results = by_name(bench_ingest.run(config))
        for name in INGEST_FIGURES:
            problems = results[name].problems
            assert results[name].met is False, results[name]
            assert any("the grants less the oracle's charges" in p for p in problems), problems
            assert not any("metering verify" in p for p in problems), problems

    def test_the_peak_rss_reads_every_worker_or_says_it_is_unmeasured(self) -> None:
        """One worker: the process itself. More: each of the supervisor's worker children,
        found from /proc whatever the kernel's options; a worker not found leaves the figure
        unmeasured, never met on the supervisor's memory alone."""
        one, every, unmeasured = bench_ingest._peak_rss_mb(os.getpid(), 1)
        assert one == every > 0 and unmeasured is None
        one, every, unmeasured = bench_ingest._peak_rss_mb(os.getpid(), 2)
        assert (one, every) == (0.0, 0.0)
        assert unmeasured == "0 of the server's 2 worker processes found"

    def test_every_event_quarantined_fails_the_ingest_figures(self) -> None:
        """The keys are gone after the setup: every event is quarantined (unknown_api_key),
        answered with a 200 all the same."""

        def forget_the_keys(url: str) -> None:
            sql(url, "DELETE FROM api_keys")

        config = bench_ingest.Config(**INGEST_SMALL, after_setup=forget_the_keys)
        results = by_name(bench_ingest.run(config))
        for name in INGEST_FIGURES:
            assert results[name].met is False, results[name]
        problems = results["ingest.batches"].problems
        assert any("'quarantined': 50" in p for p in problems), problems
        assert any(p.startswith("0 events stored of") for p in problems), problems


WEBHOOKS_SMALL: dict[str, Any] = {"events": 20, "crossings": 4, "pace": 0.01}
WEBHOOK_FIGURES = ["webhooks.throughput", "webhooks.lag_p50", "webhooks.lag_p99"]


def test_the_webhook_signature_is_the_standard_webhooks_one() -> None:
    """The example of the Standard Webhooks specification, verified by the harness's own code."""
    assert (
        bench_webhooks.signature(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            "1614265330",
            b'{"test": 2432232314}',
        )
        == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


@needs_postgresql
class TestWebhooks:
    def test_a_healthy_service_gives_every_figure_without_problems(self) -> None:
        results = bench_webhooks.run(bench_webhooks.Config(**WEBHOOKS_SMALL))
        assert [r.name for r in results] == WEBHOOK_FIGURES
        for result in results:
            assert result.problems == (), result
            assert result.measured > 0, result


def _receipt(message_id: str, kind: str, signed: bool = True, **data: Any) -> Any:
    return bench_webhooks.Receipt(0.0, {"id": message_id, "type": kind, "data": data}, signed)


def test_what_the_webhook_benchmark_refuses() -> None:
    """Each message once, signed, of its type; each crossing of its account once, at the
    balance the books say: anything else is a problem."""
    expected = {"evt_1": "webhook.test", "evt_2": "credit.balance_low"}
    good = {
        "evt_1": [_receipt("evt_1", "webhook.test")],
        "evt_2": [_receipt("evt_2", expected["evt_2"])],
    }
    assert bench_webhooks.check_messages("x", good, expected) == []
    cases = [
        ({**good, "evt_2": [_receipt("evt_2", expected["evt_2"], signed=False)]},
         "x: 1 messages without a valid signature of the endpoint"),
        ({**good, "evt_2": good["evt_2"] * 2}, "x: messages by times received: {1: 1, 2: 1}"),
        ({"evt_1": good["evt_1"]}, "x: 1 of 2 messages never arrived"),
        ({**good, "evt_3": good["evt_1"]}, "x: 1 messages not sent, e.g. evt_3"),
        ({**good, "evt_2": [_receipt("evt_2", "credit.balance_depleted")]},
         "x: 1 messages with another id or type, e.g. "
         "('evt_2', 'evt_2', 'credit.balance_depleted')"),
    ]  # fmt: skip
    for arrived, problem in cases:
        assert bench_webhooks.check_messages("x", arrived, expected) == [problem]

    books = bench_common.Books()
    books.open("acct_a", 1, [("key_a", "secret")])
    charged = Counter({"key_a": 1_000_000})
    low = _receipt(
        "evt_2", "credit.balance_low", account_id="acct_a", balance_cents=0, threshold_cents=1
    )
    crossing = {"evt_2": low}
    assert bench_webhooks._check_crossings(books, charged, {"acct_a": "key_a"}, crossing) == []
    # Charged a microcent less than the oracle's charge: the crossing's balance is wrong.
    found = bench_webhooks._check_crossings(
        books, Counter({"key_a": 999_999}), {"acct_a": "key_a"}, crossing
    )
    assert found and "the books (Decimal('0.000001'), Decimal('1'))" in found[0], found
    assert bench_webhooks._check_crossings(books, charged, {"acct_a": "key_a"}, {}) == [
        "lag: credit.balance_low for 0 accounts (1 missing, 0 twice) of 1 crossing"
    ]


CITUS_SMALL: dict[str, Any] = {
    "seconds": 0.5,
    "warmup": 0.3,
    "warming": 0.3,
    "rounds": 1,
    "workers": 1,
    "accounts": 4,
    "ingest_accounts": 2,
    "clients": 2,
    "senders": 2,
    "batch": 20,
    "shard_count": 4,
    "counted": 3,
    "ticks": 2,
    "messages": 20,
    "message_accounts": 2,
    "refusals": False,  # bench_refusals' own figures, measured by make bench BENCH=citus
}
CITUS_FIGURES = [
    "citus.authorizations",
    "citus.batches",
    "citus.singles",
    "citus.worker_cpu.authorization",
    "citus.projected.authorization",
    "citus.worker_cpu.batch_event",
    "citus.projected.batch_event",
    "citus.worker_cpu.single_event",
    "citus.projected.single_event",
    # The scheduler's work: neither goes through the gateway's routes.
    "citus.worker_cpu.tick_per_account",
    "citus.worker_cpu.webhook_message",
]
GATEWAY_FIGURES = CITUS_FIGURES[:-2]


@needs_postgresql
class TestCitus:
    """``make bench BENCH=citus``, small, on the test cluster (METERING_TEST_CITUS_URL)."""

    @pytest.fixture(autouse=True)
    def _cluster(self) -> None:
        if not CITUS:
            pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it)")

    def test_a_healthy_service_gives_every_figure_without_problems(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        config = bench_citus.Config(**CITUS_SMALL, coordinator_url=CITUS_MAINTENANCE_URL)
        results = bench_citus.run(config)
        assert [r.name for r in results] == CITUS_FIGURES
        for result in results:
            assert result.problems == (), result
            assert result.measured > 0, result
        figures = by_name(results)
        # Each throughput beside the single server's, measured in the same run.
        assert figures["citus.authorizations"].ceiling
        assert "of one PostgreSQL server" in figures["citus.authorizations"].baseline
        # The projection is one worker core's share: 1 / its CPU per operation.
        cpu = figures["citus.worker_cpu.authorization"]
        projected = figures["citus.projected.authorization"]
        assert cpu.unit == "ms" and not cpu.higher_is_better
        assert projected.measured == pytest.approx(1000 / cpu.measured)
        assert "PROJECTED" in projected.figure and projected.statistic == "projection"
        printed = capsys.readouterr().out
        assert "PROJECTION (not a measurement)" in printed
        # Round trips counted from every node's log, the cluster's server on every node: an
        # authorization's, a single event's and a batch's calls ran on the node holding the
        # account (no command from one node to another, none delegated; that the counting
        # counts: the next test).
        for kind in ("authorization", "single_event", "batch_event"):
            label = figures[f"citus.worker_cpu.{kind}"].figure
            assert "; 0.00 commands node→node" in label, label
        assert "delegated calls among them: authorizations none" in printed, printed
        assert "The cluster's API server connects to every node" in printed, printed
        # Both sides' durability the same (the cluster's nodes set to the server's for the run),
        # and their connections alike: the test's server has no TLS, and the cluster's server
        # none either (Citus turned ssl on in its nodes).
        settings = re.search(
            r"Settings: one server (.*); cluster nodes (.*); the API servers' connections: (.*)\.",
            printed,
        )
        assert settings is not None and settings[1] == settings[2], printed
        # Autovacuum off on both sides during the run (the bench vacuums before each load, so
        # that no autovacuum worker's CPU falls in a load's figures), and back on after it.
        assert "autovacuum=off" in settings[1], printed
        for node in bench_citus._node_urls(CITUS_MAINTENANCE_URL):
            assert bench_citus._settings_of(node, ["autovacuum"]) == {"autovacuum": "on"}
        assert "sslmode=disable" in settings[3], printed
        assert "webhook message delivered (20 over 2 accounts)" in printed
        # The warming before the rounds, measured apart: each kind's worker CPU beside the one
        # server's.
        warming = re.search(r"Before the rounds, each side ran each load .*", printed)
        assert warming is not None, printed
        assert re.search(r"authorization \d+\.\d{3} ms \(\d+\.\d{3} ms\)", warming[0]), warming

    def test_the_counting_counts_the_calls_a_server_on_the_coordinator_sends(
        self, tmp_path: Path
    ) -> None:
        """The control of the figures' 0.00 commands node→node: the same counting, of a server
        connected to the coordinator alone, finds each gateway call delegated to a worker (a
        command from the coordinator, naming its one-account function)."""
        config = bench_citus.Config(
            **CITUS_SMALL, coordinator_url=CITUS_MAINTENANCE_URL, every_node=False
        )
        with (
            bench_citus.citus_database(config.coordinator_url, config.shard_count) as url,
            bench_citus._side(config, "cluster", url, [], tmp_path) as side,
        ):
            trips, problems = bench_citus.count_round_trips(config, url, side.fixture, tmp_path)
        assert problems == []
        auth, single, batch = (
            trips[kind] for kind in (bench_citus.AUTH, bench_citus.EVENT, bench_citus.BATCH)
        )
        assert auth.per(auth.sent) >= 2, auth  # the check-and-hold and the void
        assert auth.calls.keys() == {"place_holds", "void"}, auth
        # Its record, confirming the lookup the server remembers (read by the warm-up's events).
        assert single.calls.get("record_usage_confirmed") == single.operations, single
        assert "lookup" not in single.calls, single
        # Each batch's one account's part, in two calls (the test's batches name one account).
        assert batch.calls.get("record_gathered", 0) >= 2, batch

    def test_a_gateway_token_that_no_longer_matches_fails_every_figure(self) -> None:
        code = CodeUnderTest(server_env=(("METERING_GATEWAY_TOKENS", "rotated-away"),))
        config = bench_citus.Config(**CITUS_SMALL, coordinator_url=CITUS_MAINTENANCE_URL, code=code)
        results = bench_citus.run(config)
        assert [r.name for r in results] == CITUS_FIGURES
        for result in results:
            if result.name in GATEWAY_FIGURES:
                assert result.met is False, result
                assert any("401" in p for p in result.problems), result
            else:
                assert result.problems == (), result


@needs_postgresql
def test_the_code_measured_is_the_checkout_given(tmp_path: Path) -> None:
    """A clean checkout of HEAD (as ``make bench-compare`` makes of BASE), marked so it records
    every process that imports it: its migrations make the schema and its server answers."""
    root = tmp_path / "checkout"
    commit = compare.checkout("HEAD", root)
    assert len(commit) == 40 and (root / "metering" / "asgi.py").exists()
    probe = tmp_path / "imported.txt"
    init = root / "metering" / "__init__.py"
    init.write_text(init.read_text() + f"\nopen({str(probe)!r}, 'a').write(__file__ + '\\n')\n")
    code = CodeUnderTest(root)
    with bench_database() as url:
        code.migrate(url, tmp_path / "cli")
        assert sql_scalar(url, "SELECT count(*) FROM alembic_version") == 1
        server = code.server(url, tmp_path / "server", workers=1).start()
        server.stop()
    imported = probe.read_text().splitlines()
    assert len(imported) >= 2  # the migrate command and the server
    assert set(imported) == {str(init)}


class TestCompare:
    """The before/after table, from recorded runs (the runs themselves are tested above)."""

    @staticmethod
    def result(name: str, measured: float, ceiling: float | None, **fields: Any) -> dict[str, Any]:
        return {
            "name": name,
            "figure": name,
            "unit": "/s",
            "statistic": "1 round",
            "measured": measured,
            "ceiling": ceiling,
            "higher_is_better": True,
            "problems": [],
            **fields,
        }

    def test_medians_ratios_and_flags(self, monkeypatch: pytest.MonkeyPatch) -> None:
        runs = {
            # (before, after) per run: rates, then a latency (lower is better)
            "rate": [(1000, 880), (1100, 870), (950, 860)],  # median 1000 -> 870: 13% worse
            "steady": [(500, 480), (520, 470), (510, 490)],  # 510 -> 480: 6% worse
            "latency": [(10.0, 10.5), (11.0, 12.0), (9.0, 11.5)],  # 10 -> 11.5: 15% worse
            "faster latency": [(10.0, 8.0), (10.0, 8.0), (10.0, 8.0)],
        }
        calls: list[str] = []

        def fake_run(side: str, code: Path, names: Any, out: Path, log: Path) -> None:
            index = sum(1 for c in calls if c == side)
            calls.append(side)
            which = 0 if side == "before" else 1
            results = [
                self.result("rate", runs["rate"][index][which], 2000.0),
                self.result("steady", runs["steady"][index][which], None),
                self.result("latency", runs["latency"][index][which], 5.0, higher_is_better=False),
                self.result(
                    "faster latency",
                    runs["faster latency"][index][which],
                    None,
                    higher_is_better=False,
                    problems=["ours: 1 of 10 operations failed"] if side == "after" else [],
                ),
            ]
            out.write_text(json.dumps({"results": results}))

        monkeypatch.setattr(compare, "_run_side", fake_run)
        lines, status = compare.compare("HEAD", ["ingest"], runs=3)

        assert calls == ["before", "after"] * 3  # alternated (one benchmark: one pair a run)
        table = [line for line in lines if line.startswith("|")]
        rows = {
            cells[0]: cells
            for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table[2:])
        }
        assert rows["rate"][2:] == ["1,000.0 /s (950.0–1,100.0)", "870.0 /s (860.0–880.0)",
                                    "0.870", "50.0%", "43.5%", "WORSE by 13%"]  # fmt: skip
        assert rows["steady"][2:] == ["510.0 /s (500.0–520.0)", "480.0 /s (470.0–490.0)",
                                      "0.941", "-", "-", ""]  # fmt: skip
        # 9–11 ms before, 10.5–12 ms after: worse, but a run of each side is within the other's
        assert rows["latency"][4:] == ["1.150", "200.0%", "230.0%", "WORSE by 15% (ranges overlap)"]
        assert rows["faster latency"][-1] == "after: ERRORS"
        assert rows["rate"][1] == "median of 3 runs (1 round each)"
        assert status == 1
        assert "ERRORS after faster latency: ours: 1 of 10 operations failed" in lines
        assert lines[-1] == "FLAGGED: rate, latency, faster latency"

    def test_a_pinned_reference_keeps_the_ratios(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Within 10% of the commit before, yet its ratio to the ceiling far below the pinned
        reference's: flagged; a figure without a ceiling has no ratio to keep."""
        # (measured, ceiling) per side, the same in every run
        sides = {
            "before": {"rate": (1000.0, 2000.0), "kept": (900.0, 1000.0), "plain": (50.0, None)},
            "after": {"rate": (950.0, 2000.0), "kept": (880.0, 1000.0), "plain": (40.0, None)},
            "reference": {"rate": (800.0, 1000.0), "kept": (450.0, 500.0), "plain": (90.0, None)},
        }
        calls: list[str] = []

        def fake_run(side: str, code: Path, names: Any, out: Path, log: Path) -> None:
            calls.append(side)
            results = [
                self.result(name, measured, ceiling)
                for name, (measured, ceiling) in sides[side].items()
            ]
            out.write_text(json.dumps({"results": results}))

        monkeypatch.setattr(compare, "_run_side", fake_run)
        lines, status = compare.compare("HEAD", ["ingest"], runs=3, reference="HEAD")

        assert calls == ["before", "after", "reference"] * 3
        table = [line for line in lines if line.startswith("|")]
        assert [c.strip() for c in table[0].strip("|").split("|")][-2:] == [
            "reference ÷ ceiling",
            "flag",
        ]
        rows = {
            cells[0]: cells
            for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table[2:])
        }
        # 47.5% of the ceiling against the reference's 80%: 41% worse
        assert rows["rate"][4:] == ["0.950", "50.0%", "47.5%", "80.0%",
                                    "RATIO 41% WORSE THAN THE REFERENCE'S"]  # fmt: skip
        assert rows["kept"][4:] == ["0.978", "90.0%", "88.0%", "90.0%", ""]
        assert rows["plain"][4:] == ["0.800", "-", "-", "-", "WORSE by 20%"]
        assert status == 1
        assert lines[-1] == "FLAGGED: rate, plain"
