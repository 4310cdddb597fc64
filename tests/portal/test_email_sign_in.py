"""Sign-in links by email, over HTTP against the real server and a real SMTP server (aiosmtpd):
the link arrives (sent by the scheduler's pass, not by the request), signs in once, expires;
an unknown address gets the same page and no mail; the sixth request of an hour sends nothing;
an address of several accounts gets one mail with a link for each; a member an admin adds in
the portal is emailed its link; a failed send is retried, and the SMTP password is never
logged."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx2 as httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import select

from metering.models import PortalMail
from metering.portal.sessions import LINK_LIFETIME
from metering.scheduler import Scheduler
from metering.settings import Settings, describe_error
from tests.conftest import APP_BACKENDS, NOW, Api, migrated_database
from tests.factories import create_account, unique
from tests.portal.browser import serving
from tests.portal.smtp import Inbox, send_mails, smtp_server
from tests.servers import free_port

SENDER = "Billing <billing@example.com>"


@pytest.fixture(scope="module")
def inbox() -> Iterator[Inbox]:
    with smtp_server() as server:
        yield server


@pytest.fixture(scope="module", params=APP_BACKENDS)
def mailing(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, inbox: Inbox
) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp(f"mail-{request.param}")
    with (
        migrated_database(request.param, tmp) as url,
        serving(request.param, url, tmp, smtp_url=inbox.url, mail_from=SENDER) as api,
    ):
        yield api


@pytest.fixture
def api(mailing: Api) -> Iterator[Api]:
    mailing.clock.set(NOW)
    yield mailing
    mailing.clock.set(NOW)


@pytest.fixture
def client(api: Api) -> Iterator[httpx.Client]:
    """A browser of its own: its cookies (the sign-in nonce, then the session) kept."""
    with httpx.Client(base_url=str(api.client.base_url), timeout=30) as browser:
        yield browser


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


def _ask(client: httpx.Client, address: str) -> httpx.Response:
    """The sign-in page's "email me a sign-in link", as a browser sends it."""
    page = client.get("/billing/sign-in")
    assert page.status_code == 200, page.text
    assert 'action="/billing/sign-in/email"' in page.text
    return client.post(
        "/billing/sign-in/email", data={"csrf_token": _csrf(page.text), "email": address}
    )


def _answered(response: httpx.Response, address: str) -> str:
    """The answer page (the same whoever asks), with the address taken out."""
    assert response.status_code == 200, response.text
    assert "Check your email" in response.text and address in response.text, response.text
    return response.text.replace(address, "ADDRESS")


def _member(api: Api, account: str, email: str, role: str = "developer") -> dict[str, Any]:
    response = api.admin(
        "POST", f"/admin/v1/accounts/{account}/members", json={"email": email, "role": role}
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


def _confirm(client: httpx.Client, link: str) -> httpx.Response:
    """Open the link (its confirmation page) and press its button."""
    page = client.get(link)
    assert page.status_code == 200, page.text
    assert 'id="confirm"' in page.text
    return client.post(link, data={"csrf_token": _csrf(page.text)})


def _signed_in_as(client: httpx.Client, account: str) -> str:
    """The overview page of the account the session is signed in to."""
    page = client.get("/billing")
    assert page.status_code == 200, page.text
    assert f"<code>{account}</code>" in page.text, page.text
    return page.text


class TestTheLinkArrives:
    def test_it_is_sent_by_the_scheduler_signs_in_once_and_as_the_member(
        self, api: Api, inbox: Inbox, client: httpx.Client
    ) -> None:
        account = create_account(api)
        address = f"{unique('ada')}@example.com"
        member = _member(api, account, address)
        _answered(_ask(client, address.upper()), address.upper())
        assert inbox.to(address) == []  # the request only recorded it
        assert send_mails(api) == 1
        (mail,) = inbox.to(address)
        assert mail.message["To"] == address and mail.message["From"] == SENDER
        assert mail.message["Subject"] == "Your sign-in link to the billing portal"
        (link,) = mail.links
        assert link.startswith(f"{api.client.base_url}/billing/sign-in/")
        assert account in mail.body and "as developer" in mail.body

        signed_in = _confirm(client, link)
        assert signed_in.status_code == 303, signed_in.text
        assert signed_in.headers["location"] == "/billing"
        page = _signed_in_as(client, account)
        assert 'href="/billing/keys"' in page and 'href="/billing/members"' not in page
        # Once: the same link again is refused, on its page and by its button.
        again = httpx.Client(base_url=str(api.client.base_url), timeout=30)
        with again:
            assert again.get(link).status_code == 410
        form = client.get("/billing/sign-in")
        spent = client.post(link, data={"csrf_token": _csrf(form.text)})
        assert spent.status_code == 410 and "sign-in link" in spent.text.lower(), spent.text
        assert send_mails(api) == 0  # sent once
        # The session is the member's: what it changes is audited as the member.
        keys = client.get("/billing/keys")
        made = client.post(
            "/billing/keys", data={"csrf_token": _csrf(keys.text), "name": "from-mail"}
        )
        assert made.status_code == 200 and 'id="created-secret"' in made.text, made.text
        (key,) = api.admin("GET", f"/admin/v1/accounts/{account}/api-keys").json()["data"]
        assert (key["name"], key["member_id"]) == ("from-mail", member["id"])

    def test_a_link_expires_after_15_minutes(
        self, api: Api, inbox: Inbox, client: httpx.Client
    ) -> None:
        account = create_account(api)
        address = f"{unique('late')}@example.com"
        _member(api, account, address)
        _answered(_ask(client, address), address)
        assert send_mails(api) == 1
        ((link,),) = [m.links for m in inbox.to(address)]
        api.clock.advance(seconds=LINK_LIFETIME.total_seconds())
        refused = client.get(link)
        assert refused.status_code == 410 and "sign-in link" in refused.text.lower(), refused.text
        page = client.get("/billing/sign-in")
        posted = client.post(link, data={"csrf_token": _csrf(page.text)})
        assert posted.status_code == 410, posted.text
        assert client.get("/billing").status_code == 401

    def test_an_address_of_several_accounts_gets_one_mail_with_a_link_for_each(
        self, api: Api, inbox: Inbox, client: httpx.Client
    ) -> None:
        address = f"{unique('both')}@example.com"
        first, second = create_account(api, name="A " + unique("a")), create_account(api)
        _member(api, first, address, "admin")
        _member(api, second, address.title(), "viewer")
        _answered(_ask(client, address), address)
        assert send_mails(api) == 1
        (mail,) = inbox.to(address)
        links = mail.links
        assert len(links) == 2
        assert "as admin" in mail.body and "as viewer" in mail.body
        by_account = {}
        for link in links:
            client.cookies.clear()
            assert _confirm(client, link).status_code == 303
            page = client.get("/billing").text
            account = first if f"<code>{first}</code>" in page else second
            by_account[account] = 'href="/billing/members"' in page  # an admin's page
        assert by_account == {first: True, second: False}


class TestNoEnumeration:
    def test_an_unknown_or_removed_address_gets_the_same_page_and_no_mail(
        self, api: Api, inbox: Inbox, client: httpx.Client
    ) -> None:
        account = create_account(api)
        known = f"{unique('known')}@example.com"
        _member(api, account, known)
        removed = _member(api, account, f"{unique('gone')}@example.com")
        assert api.admin("DELETE", f"/admin/v1/members/{removed['id']}").status_code == 200
        unknown = f"{unique('nobody')}@example.com"
        pages = {
            address: _answered(_ask(client, address), address)
            for address in (known, removed["email"], unknown)
        }
        assert len(set(pages.values())) == 1, pages
        assert send_mails(api) == 1
        assert len(inbox.to(known)) == 1
        assert inbox.to(unknown) == [] and inbox.to(removed["email"]) == []

    def test_what_is_not_an_address_is_refused_on_the_sign_in_page(
        self, api: Api, client: httpx.Client
    ) -> None:
        response = _ask(client, "not an address")
        assert response.status_code == 400, response.text
        assert "Enter your email address" in response.text
        assert 'action="/billing/sign-in/email"' in response.text
        page = client.get("/billing/sign-in")
        forged = client.post("/billing/sign-in/email", data={"email": "a@example.com"})
        assert forged.status_code == 403 and "security token" in forged.text, forged.text
        assert page.status_code == 200


class TestAtMostFiveAnHour:
    def test_the_sixth_request_of_an_hour_sends_nothing(
        self, api: Api, inbox: Inbox, client: httpx.Client
    ) -> None:
        account = create_account(api)
        address = f"{unique('eager')}@example.com"
        _member(api, account, address)
        answers = set()
        for _ in range(6):
            answers.add(_answered(_ask(client, address), address))
            api.clock.advance(minutes=5)
        assert len(answers) == 1  # the sixth is answered as the others
        assert send_mails(api) == 5
        assert len(inbox.to(address)) == 5
        # In the database, not in a process: another server on the same database refuses too.
        with serving(
            api.backend,
            api.url,
            api.settings.data_dir,
            smtp_url=api.settings.smtp_url,
            mail_from=SENDER,
        ) as other:
            other.clock.set(api.clock.now())
            with httpx.Client(base_url=str(other.client.base_url), timeout=30) as elsewhere:
                _answered(_ask(elsewhere, address), address)
        assert send_mails(api) == 0
        # An hour after the first, one more is let through (at most 5 in any hour).
        api.clock.set(NOW + timedelta(hours=1, seconds=1))
        _answered(_ask(client, address), address)
        assert send_mails(api) == 1
        assert len(inbox.to(address)) == 6
        with api.database.reading() as session:
            rows = session.execute(
                select(PortalMail.outcome).where(PortalMail.address == address)
            ).scalars()
            assert sorted(rows) == ["sent"] * 6

    def test_twelve_requests_at_once_on_two_servers_record_five(
        self, api: Api, inbox: Inbox
    ) -> None:
        account = create_account(api)
        address = f"{unique('race')}@example.com"
        _member(api, account, address)
        with serving(
            api.backend,
            api.url,
            api.settings.data_dir,
            smtp_url=api.settings.smtp_url,
            mail_from=SENDER,
        ) as other:
            other.clock.set(api.clock.now())
            bases = [str(server.client.base_url) for server in (api, other)] * 6
            browsers = [httpx.Client(base_url=base, timeout=60) for base in bases]
            try:
                forms = [_csrf(b.get("/billing/sign-in").text) for b in browsers]
                start = threading.Barrier(len(browsers))

                def ask(index: int) -> httpx.Response:
                    start.wait()
                    return browsers[index].post(
                        "/billing/sign-in/email",
                        data={"csrf_token": forms[index], "email": address},
                    )

                with ThreadPoolExecutor(len(browsers)) as pool:
                    answers = list(pool.map(ask, range(len(browsers))))
            finally:
                for browser in browsers:
                    browser.close()
        assert len({_answered(answer, address) for answer in answers}) == 1
        assert send_mails(api) == 5
        assert len(inbox.to(address)) == 5


class TestAnAdminAddsAMember:
    def test_the_new_member_is_emailed_its_link_and_the_page_shows_none(
        self, api: Api, inbox: Inbox, client: httpx.Client
    ) -> None:
        account = create_account(api)
        owner = api.admin("POST", f"/admin/v1/accounts/{account}/portal-sessions").json()["url"]
        assert _confirm(client, owner).status_code == 303
        page = client.get("/billing/members")
        address = f"{unique('new')}@example.com"
        added = client.post(
            "/billing/members",
            data={"csrf_token": _csrf(page.text), "email": address, "role": "viewer"},
        )
        assert added.status_code == 200, added.text
        assert 'id="created-mailed"' in added.text and "/billing/sign-in/" not in added.text
        (member,) = api.admin("GET", f"/admin/v1/accounts/{account}/members").json()["data"]
        assert member["email"] == address
        assert send_mails(api) == 1
        (mail,) = inbox.to(address)
        assert "added to the account" in mail.body and "as viewer" in mail.body
        (link,) = mail.links
        client.cookies.clear()
        assert _confirm(client, link).status_code == 303
        page_text = _signed_in_as(client, account)
        assert 'href="/billing/members"' not in page_text  # a viewer


class TestDelivery:
    def test_a_failed_send_is_retried_and_the_password_never_logged(
        self, api: Api, inbox: Inbox, client: httpx.Client, caplog: pytest.LogCaptureFixture
    ) -> None:
        account = create_account(api)
        address = f"{unique('retry')}@example.com"
        _member(api, account, address)
        _answered(_ask(client, address), address)
        down = f"smtp://mailer:hunter2-secret@127.0.0.1:{free_port()}"
        with caplog.at_level(logging.DEBUG):
            assert send_mails(api, smtp_url=down) == 0
        assert "hunter2" not in caplog.text and "not sent (retried)" in caplog.text
        assert send_mails(api) == 0  # its retry is 30 seconds later
        api.clock.advance(seconds=30)
        assert send_mails(api) == 1
        (mail,) = inbox.to(address)
        assert len(mail.links) == 1

    def test_a_server_that_asks_for_a_login_gets_the_urls_user_and_password(
        self, api: Api, client: httpx.Client
    ) -> None:
        account = create_account(api)
        address = f"{unique('login')}@example.com"
        _member(api, account, address)
        _answered(_ask(client, address), address)
        with smtp_server(with_login=True) as guarded:
            assert send_mails(api, smtp_url=guarded.url) == 1
        assert guarded.logins == [("mailer", "p@ss:word/1")]
        (mail,) = guarded.to(address)
        assert len(mail.links) == 1


class TestTidyUp:
    def test_the_tick_deletes_a_sent_mail_an_hour_after_it_was_asked_for(
        self, api: Api, inbox: Inbox, client: httpx.Client
    ) -> None:
        address = f"{unique('tidy')}@example.com"
        _member(api, create_account(api), address)
        _answered(_ask(client, address), address)
        assert send_mails(api) == 1

        def outcomes() -> list[str | None]:
            with api.database.reading() as session:
                query = select(PortalMail.outcome).where(PortalMail.address == address)
                return list(session.execute(query).scalars())

        jobs = Scheduler(api.database, api.settings, api.clock)
        try:
            api.clock.set(NOW + timedelta(minutes=59))
            report = jobs.tick()
            assert report.mails_deleted is not None and report.ok, report.errors
            assert outcomes() == ["sent"]  # still counted: asked for within the hour
            api.clock.set(NOW + timedelta(hours=1))
            report = jobs.tick()
            assert report.mails_deleted is not None and report.mails_deleted >= 1, report
            assert outcomes() == []
        finally:
            jobs.close()


class TestSettings:
    def test_the_smtp_url_is_checked_and_its_password_never_shown(self) -> None:
        url = "smtps://mailer:hunter2-secret@smtp.example.com"
        settings = Settings(smtp_url=url, mail_from="billing@example.com")
        assert settings.mail_on and "hunter2" not in repr(settings)
        for bad in ("ftp://mailer:hunter2-secret@smtp.example.com", "smtp://:hunter2-secret@"):
            with pytest.raises(ValidationError) as refused:
                Settings(smtp_url=bad, mail_from="billing@example.com")
            text = describe_error(refused.value)
            assert text.startswith("METERING_SMTP_URL: must be smtp://") and "hunter2" not in text
        with pytest.raises(ValidationError) as refused:
            Settings(smtp_url=url)
        assert "METERING_MAIL_FROM is required" in describe_error(refused.value)
        assert not Settings().mail_on

    def test_without_smtp_the_sign_in_page_offers_no_email_form(self, tmp_path: Any) -> None:
        with (
            migrated_database("sqlite", tmp_path) as url,
            serving("sqlite", url, tmp_path) as plain,
        ):
            page = plain.client.get("/billing/sign-in")
            assert page.status_code == 200 and "/billing/sign-in/email" not in page.text
            refused = plain.client.post("/billing/sign-in/email", data={"email": "a@b.c"})
            assert refused.status_code == 404, refused.text
