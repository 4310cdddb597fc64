"""Webhook delivery (docs/api.md#messages-and-delivery): a real receiver on loopback, messages
verified by the ``standardwebhooks`` library; retries on the schedule with the one clock moved,
timeouts, no redirects, https with a test CA, addresses refused when connecting, rotation's two
signatures, resend, delete."""

from __future__ import annotations

import ssl
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import standardwebhooks
import trustme

from metering.notifications.delivery import RETRY_SCHEDULE, retry_delay
from tests.factories import create_account, create_key
from tests.notifications.conftest import TIMEOUT, Hooks
from tests.notifications.hosts import resolving
from tests.notifications.receiver import Step, receiving, verified


def _test_event(hooks: Hooks, endpoint_id: str) -> str:
    response = hooks.api.admin("POST", f"/admin/v1/webhook-endpoints/{endpoint_id}/test")
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


class TestSigned:
    def test_a_test_event_arrives_signed_and_is_listed_as_delivered(self, hooks: Hooks) -> None:
        account = create_account(hooks.api)
        with receiving() as receiver:
            endpoint = hooks.endpoint(receiver.url(), ["webhook.test"], account)
            event_id = _test_event(hooks, endpoint["id"])
            report = hooks.deliverer().run_once()
            assert (report.attempted, report.delivered) == (1, 1)
            (message,) = receiver.wait_for(1)
        body = verified(endpoint["secret"], message)
        assert body == {
            "id": event_id,
            "type": "webhook.test",
            "created_at": body["created_at"],
            "data": {"account_id": account},
        }
        assert message.headers["webhook-id"] == event_id
        assert message.headers["content-type"] == "application/json"
        with pytest.raises(standardwebhooks.WebhookVerificationError):
            standardwebhooks.Webhook("whsec_" + "A" * 43 + "=").verify(
                message.body, message.headers
            )
        (delivery,) = hooks.deliveries(endpoint["id"])
        assert delivery["event_id"] == event_id and delivery["status"] == "delivered"
        assert delivery["attempts"] == 1 and delivery["last_status"] == 200
        assert delivery["delivered_at"] is not None and delivery["next_attempt_at"] is None

    def test_rotation_signs_with_both_secrets_for_24_hours(self, hooks: Hooks) -> None:
        with receiving() as receiver:
            endpoint = hooks.endpoint(receiver.url(), ["webhook.test"], create_account(hooks.api))
            rotated = hooks.api.admin(
                "POST", f"/admin/v1/webhook-endpoints/{endpoint['id']}/rotate-secret"
            )
            assert rotated.status_code == 200, rotated.text
            new_secret = rotated.json()["secret"]
            assert new_secret.startswith("whsec_") and new_secret != endpoint["secret"]
            _test_event(hooks, endpoint["id"])
            hooks.deliverer().run_once()
            (first,) = receiver.wait_for(1)
            assert len(first.headers["webhook-signature"].split(" ")) == 2
            verified(endpoint["secret"], first)
            verified(new_secret, first)
            # 24 hours later, only the new secret signs. (Verified with the library's signing
            # function: its timestamp check uses the wall clock, which did not move.)
            hooks.api.clock.advance(hours=24)
            _test_event(hooks, endpoint["id"])
            hooks.deliverer().run_once()
            second = receiver.wait_for(2)[1]
        (signature,) = second.headers["webhook-signature"].split(" ")
        stamp = second.headers["webhook-timestamp"]
        expected = standardwebhooks.Webhook(new_secret).sign(
            second.headers["webhook-id"],
            hooks.api.clock.now().fromtimestamp(int(stamp), hooks.api.clock.now().tzinfo),
            second.body.decode(),
        )
        assert signature == expected


class TestRetries:
    def test_fails_twice_then_succeeds_three_attempts_one_id_on_the_schedule(
        self, hooks: Hooks
    ) -> None:
        with receiving() as receiver:
            receiver.plan = [Step(500), Step(503)]
            endpoint = hooks.endpoint(receiver.url(), ["webhook.test"], create_account(hooks.api))
            event_id = _test_event(hooks, endpoint["id"])
            deliverer = hooks.deliverer()
            deliverer.run_once()
            receiver.wait_for(1)
            (delivery,) = hooks.deliveries(endpoint["id"])
            assert (delivery["status"], delivery["attempts"]) == ("pending", 1)
            assert (delivery["last_status"], delivery["last_error"]) == (500, "HTTP 500")
            # Not before its time: 5 s after the first failure (no jitter here), then 30 s.
            hooks.api.clock.advance(seconds=4.9)
            assert deliverer.run_once().attempted == 0
            hooks.api.clock.advance(seconds=0.1)
            assert deliverer.run_once().attempted == 1
            hooks.api.clock.advance(seconds=29.9)
            assert deliverer.run_once().attempted == 0
            hooks.api.clock.advance(seconds=0.1)
            assert deliverer.run_once().delivered == 1
            messages = receiver.wait_for(3)
        assert [m.headers["webhook-id"] for m in messages] == [event_id] * 3
        assert len({m.body for m in messages}) == 1  # the same body on every attempt
        for message in messages:
            verified(endpoint["secret"], message)
        (delivery,) = hooks.deliveries(endpoint["id"])
        assert (delivery["status"], delivery["attempts"]) == ("delivered", 3)

    def test_the_schedule_and_its_jitter(self) -> None:
        assert [d.total_seconds() for d in RETRY_SCHEDULE] == [
            5, 30, 120, 600, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600,
        ]  # fmt: skip
        assert retry_delay(1, lambda: 0.0) == timedelta(seconds=4)
        assert retry_delay(1, lambda: 1.0) == timedelta(seconds=6)
        assert retry_delay(9, lambda: 0.5) == timedelta(hours=24)

    def test_after_the_last_retry_the_delivery_fails(self, hooks: Hooks) -> None:
        with receiving() as receiver:
            receiver.plan = [Step(500)] * 10
            endpoint = hooks.endpoint(receiver.url(), ["webhook.test"], create_account(hooks.api))
            _test_event(hooks, endpoint["id"])
            deliverer = hooks.deliverer()
            deliverer.run_once()
            for delay in RETRY_SCHEDULE:
                hooks.api.clock.advance(seconds=delay.total_seconds())
                assert deliverer.run_once().attempted == 1
            receiver.wait_for(10)
        (delivery,) = hooks.deliveries(endpoint["id"])
        assert (delivery["status"], delivery["attempts"]) == ("failed", 10)
        assert delivery["next_attempt_at"] is None

    def test_a_receiver_that_hangs_times_out_and_is_retried(self, hooks: Hooks) -> None:
        with receiving() as receiver:
            receiver.plan = [Step(200, delay=TIMEOUT * 6)]
            endpoint = hooks.endpoint(receiver.url(), ["webhook.test"], create_account(hooks.api))
            _test_event(hooks, endpoint["id"])
            deliverer = hooks.deliverer()
            assert deliverer.run_once().delivered == 0
            (delivery,) = hooks.deliveries(endpoint["id"])
            assert delivery["status"] == "pending" and delivery["attempts"] == 1
            assert delivery["last_error"].startswith("timeout")
            hooks.api.clock.advance(seconds=5)
            assert deliverer.run_once().delivered == 1

    def test_a_redirect_is_not_followed(self, hooks: Hooks) -> None:
        with receiving() as receiver:
            receiver.plan = [Step(302, headers=(("location", receiver.url("/elsewhere")),))]
            endpoint = hooks.endpoint(receiver.url(), ["webhook.test"], create_account(hooks.api))
            _test_event(hooks, endpoint["id"])
            assert hooks.deliverer().run_once().delivered == 0
            receiver.wait_for(1)
            assert [r.path for r in receiver.received] == ["/hook"]
        (delivery,) = hooks.deliveries(endpoint["id"])
        assert (delivery["status"], delivery["last_status"]) == ("pending", 302)


class TestTransport:
    def test_https_to_a_server_with_its_own_ca_through_the_ca_bundle(
        self, hooks: Hooks, tmp_path: Path
    ) -> None:
        ca = trustme.CA()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
        bundle = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(bundle))
        with receiving(tls=context) as receiver:
            endpoint = hooks.endpoint(
                receiver.url(host="localhost"), ["webhook.test"], create_account(hooks.api)
            )
            # Without the bundle the certificate is not trusted: not delivered.
            _test_event(hooks, endpoint["id"])
            assert hooks.deliverer().run_once().delivered == 0
            (delivery,) = hooks.deliveries(endpoint["id"])
            assert "certificate" in delivery["last_error"].lower() or "ssl" in (
                delivery["last_error"].lower()
            )
            hooks.api.clock.advance(seconds=5)
            assert hooks.deliverer(webhook_ca_bundle=bundle).run_once().delivered == 1
            (message,) = [m for m in receiver.received if m.body]
            verified(endpoint["secret"], message)

    def test_a_name_that_resolves_to_loopback_is_refused_when_connecting(
        self, hooks: Hooks
    ) -> None:
        with receiving() as receiver:
            url = f"https://rebound.invalid:{receiver.port}/hook"
            endpoint = hooks.endpoint(url, ["webhook.test"], create_account(hooks.api))
            _test_event(hooks, endpoint["id"])
            strict = hooks.deliverer(
                resolver=lambda host, port: ["127.0.0.1"], webhook_allow_private=False
            )
            assert strict.run_once().delivered == 0
            assert receiver.received == []
        (delivery,) = hooks.deliveries(endpoint["id"])
        assert "private" in delivery["last_error"]

    def test_names_the_system_resolver_maps_to_private_addresses_are_refused(
        self, hooks: Hooks
    ) -> None:
        """The delivery loop's own resolver (the system's, through /etc/hosts): names saved while
        they did not resolve, then answered with loopback, private or IPv4-mapped addresses."""
        tag = uuid.uuid4().hex[:12]
        loopback, mapped, private = (f"{n}-{tag}.test" for n in ("loop", "mapped", "private"))
        account = create_account(hooks.api)
        with receiving() as receiver:
            hosts = [loopback, f"{loopback}.", "localhost.", mapped, private]
            endpoints = [
                hooks.endpoint(receiver.url(host=h), ["webhook.test"], account) for h in hosts
            ]
            for endpoint in endpoints:
                _test_event(hooks, endpoint["id"])
            names = {loopback: "127.0.0.1", mapped: "::ffff:127.0.0.1", private: "10.0.0.1"}
            with resolving(names):
                assert hooks.deliverer(webhook_allow_private=False).run_once().delivered == 0
                assert receiver.received == []
                for endpoint in endpoints:
                    (delivery,) = hooks.deliveries(endpoint["id"])
                    assert "private" in delivery["last_error"], (endpoint["url"], delivery)
                # The same names and the same resolver reach the receiver when allowed.
                hooks.api.clock.advance(seconds=5)
                hooks.deliverer(webhook_allow_private=True).run_once()
                assert len(receiver.wait_for(4)) == 4
        statuses = [hooks.deliveries(e["id"])[0]["status"] for e in endpoints]
        assert statuses == ["delivered"] * 4 + ["pending"]


class TestManagement:
    def test_resend_sends_the_same_event_again(self, hooks: Hooks) -> None:
        with receiving() as receiver:
            endpoint = hooks.endpoint(receiver.url(), ["webhook.test"], create_account(hooks.api))
            event_id = _test_event(hooks, endpoint["id"])
            hooks.deliverer().run_once()
            response = hooks.api.admin(
                "POST", f"/admin/v1/webhook-events/{event_id}/resend", json={}
            )
            assert response.status_code == 200, response.text
            assert response.json()["endpoint_ids"] == [endpoint["id"]]
            hooks.deliverer().run_once()
            messages = receiver.wait_for(2)
        assert [m.headers["webhook-id"] for m in messages] == [event_id, event_id]
        assert messages[0].body == messages[1].body
        unknown = hooks.api.admin("POST", "/admin/v1/webhook-events/evt_nope/resend", json={})
        assert unknown.status_code == 404

    def test_delete_drops_undelivered_messages(self, hooks: Hooks) -> None:
        with receiving() as receiver:
            endpoint = hooks.endpoint(receiver.url(), ["webhook.test"], create_account(hooks.api))
            _test_event(hooks, endpoint["id"])
            deleted = hooks.api.admin("DELETE", f"/admin/v1/webhook-endpoints/{endpoint['id']}")
            assert deleted.status_code == 200, deleted.text
            hooks.deliverer().run_once()
            assert receiver.received == []
        gone = hooks.api.admin("GET", f"/admin/v1/webhook-endpoints/{endpoint['id']}")
        assert gone.status_code == 404

    def test_an_account_key_tests_its_own_endpoint(self, hooks: Hooks) -> None:
        account = create_account(hooks.api)
        key = create_key(hooks.api, account)
        with receiving() as receiver:
            made = hooks.api.as_key(
                key.secret,
                "POST",
                "/v1/webhook-endpoints",
                json={"url": receiver.url(), "event_types": ["webhook.test"]},
            )
            assert made.status_code == 201, made.text
            endpoint = made.json()
            assert endpoint["account_id"] == account
            sent = hooks.api.as_key(
                key.secret, "POST", f"/v1/webhook-endpoints/{endpoint['id']}/test"
            )
            assert sent.status_code == 200, sent.text
            hooks.deliverer().run_once()
            (message,) = receiver.wait_for(1)
        assert verified(endpoint["secret"], message)["data"] == {"account_id": account}
        listed = hooks.api.as_key(
            key.secret, "GET", f"/v1/webhook-endpoints/{endpoint['id']}/deliveries"
        )
        assert [d["status"] for d in listed.json()["data"]] == ["delivered"]


class TestDisabled:
    def test_a_disabled_endpoints_messages_wait_until_it_is_enabled(self, hooks: Hooks) -> None:
        with receiving() as receiver:
            endpoint = hooks.endpoint(receiver.url(), ["webhook.test"], create_account(hooks.api))
            path = f"/admin/v1/webhook-endpoints/{endpoint['id']}"
            event_id = _test_event(hooks, endpoint["id"])
            assert hooks.api.admin("PATCH", path, json={"enabled": False}).status_code == 200
            assert hooks.deliverer().run_once().attempted == 0
            assert receiver.received == []
            assert hooks.api.admin("PATCH", path, json={"enabled": True}).status_code == 200
            assert hooks.deliverer().run_once().delivered == 1
            (message,) = receiver.wait_for(1)
        assert message.headers["webhook-id"] == event_id

    def test_a_secret_no_configured_key_opens_is_not_sent_until_the_key_is_back(
        self, hooks: Hooks
    ) -> None:
        with receiving() as receiver:
            endpoint = hooks.endpoint(receiver.url(), ["webhook.test"], create_account(hooks.api))
            _test_event(hooks, endpoint["id"])
            wrong = hooks.deliverer(secret_key=["another-key-of-at-least-32-characters"])
            assert wrong.run_once().delivered == 0
            assert receiver.received == []
            (delivery,) = hooks.deliveries(endpoint["id"])
            assert "METERING_SECRET_KEY" in delivery["last_error"]
            hooks.api.clock.advance(seconds=5)
            assert hooks.deliverer().run_once().delivered == 1
            receiver.wait_for(1)
