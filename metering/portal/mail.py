"""Sign-in links by email (with ``METERING_SMTP_URL``): the outbox the requests write and the
scheduler's pass that sends it.

The request only records (a row of ``portal_mails``, in its own transaction) and answers; the
scheduler looks the address up, makes the links and talks to the SMTP server. So the sign-in
page's answer is the same page, after the same work, whether or not the address is a member's:
nothing to learn from it, nor from its timing.

* ``ask_for_link``: the sign-in page's "email me a sign-in link". At most ``LINKS_PER_HOUR``
  requests of one address in any hour are recorded (the rows of the last hour are the count,
  taken under the address's lock, so several processes never together let a sixth through);
  the others are answered the same and send nothing.
* ``mail_new_member``: an admin added a member in the portal; the member gets its link.
* ``Mailer.run_once``: one pass (the scheduler's, every second). An address that is a member
  of several accounts gets one mail with one link per account (its own role in each); an
  address of no member (or a member since removed) gets nothing. A failed send is retried on
  ``RETRY_SCHEDULE``, each attempt with new links (none is stored but as its hash).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.message import EmailMessage
from email.utils import make_msgid

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from metering import citus
from metering.accounts.projects import email_key
from metering.db import Database, is_postgresql
from metering.kit import smtp
from metering.kit.clock import Clock
from metering.kit.ids import new_id
from metering.kit.timeutil import format_timestamp
from metering.models import Account, Member, PortalMail, table
from metering.portal import sessions
from metering.settings import Settings

log = logging.getLogger("metering.portal.mail")

MAILS = table(PortalMail)
MEMBERS = table(Member)
ACCOUNTS = table(Account)

SIGN_IN = "sign_in"
MEMBER_ADDED = "member_added"
SENT, NO_MEMBER, FAILED = "sent", "no_member", "failed"

LINKS_PER_HOUR = 5
RATE_WINDOW = timedelta(hours=1)
BATCH = 20
LEASE = timedelta(seconds=60)  # a sender that dies mid-send: the mail is taken again after it
# Retried after these delays, then failed (4 attempts in all): a sign-in link is wanted now.
RETRY_SCHEDULE = (timedelta(seconds=30), timedelta(minutes=2), timedelta(minutes=5))


def _address_lock(session: Session, address: str) -> None:
    """Serialise an address's requests until the transaction ends: an advisory lock on
    PostgreSQL and the coordinator of a cluster; SQLite's writers take turns already."""
    if is_postgresql(session):
        digest = hashlib.sha256(address.encode("utf-8", "surrogatepass")).digest()
        key = int.from_bytes(digest[:4], "big", signed=True)
        citus.lock(session, citus.SIGN_IN_MAIL_LOCK, key, wait=True)


def ask_for_link(session: Session, address: str, now: datetime) -> bool:
    """Record that ``address`` asked for a sign-in link, unless it asked ``LINKS_PER_HOUR``
    times in the last hour already; whether it was recorded (the page says the same either
    way)."""
    address = email_key(address)
    _address_lock(session, address)
    asked = session.execute(
        select(func.count())
        .select_from(MAILS)
        .where(
            MAILS.c.address == address,
            MAILS.c.kind == SIGN_IN,
            MAILS.c.created_at > now - RATE_WINDOW,
        )
    ).scalar_one()
    if asked >= LINKS_PER_HOUR:
        return False
    _record(session, SIGN_IN, address, None, None, now)
    return True


def mail_new_member(session: Session, member: Member, now: datetime) -> None:
    """Record the sign-in mail of a member just added, in the transaction that adds it."""
    _record(session, MEMBER_ADDED, member.email, member.account_id, member.id, now)


def _record(
    session: Session,
    kind: str,
    address: str,
    account_id: str | None,
    member_id: str | None,
    now: datetime,
) -> None:
    session.execute(
        insert(MAILS).values(
            id=new_id("pmail"),
            kind=kind,
            address=address,
            account_id=account_id,
            member_id=member_id,
            created_at=now,
            attempts=0,
            next_attempt_at=now,
        )
    )


def delete_finished(session: Session, now: datetime) -> int:
    """Mails sent (or given up) and older than the rate's hour: nothing counts them again."""
    deleted = session.execute(
        delete(MAILS).where(MAILS.c.outcome.isnot(None), MAILS.c.created_at <= now - RATE_WINDOW)
    )
    return int(deleted.rowcount)  # type: ignore[attr-defined]


# -- the scheduler's pass -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    id: str
    kind: str
    address: str
    account_id: str | None
    member_id: str | None
    attempts: int


@dataclass(frozen=True, slots=True)
class Membership:
    account_id: str
    account_name: str
    member_id: str
    email: str
    role: str


class Mailer:
    """Sends the outbox's due mails through ``METERING_SMTP_URL``."""

    def __init__(self, database: Database, settings: Settings, clock: Clock) -> None:
        self.database = database
        self.clock = clock
        self.target = smtp.smtp_target(settings.smtp_url)
        self.sender = settings.mail_from
        self.base_url = sessions.public_base_url(settings)

    def run_once(self) -> int:
        """Every due mail, sent (or its failure recorded); how many were sent."""
        sent = 0
        while True:
            claimed = self.claim()
            sent += sum(self.deliver(mail) for mail in claimed)
            if len(claimed) < BATCH:
                return sent

    def claim(self) -> list[Claimed]:
        """Due mails, each taken by one conditional update (so two schedulers never both take
        one), its attempt counted and its next attempt put a lease ahead."""
        now = self.clock.now()
        with self.database.unit_of_work() as session:
            due = session.execute(
                select(MAILS.c.id)
                .where(MAILS.c.next_attempt_at <= now)
                .order_by(MAILS.c.next_attempt_at, MAILS.c.id)
                .limit(BATCH)
            ).scalars()
            claimed = []
            for mail_id in list(due):
                row = session.execute(
                    update(MAILS)
                    .where(MAILS.c.id == mail_id, MAILS.c.next_attempt_at <= now)
                    .values(attempts=MAILS.c.attempts + 1, next_attempt_at=now + LEASE)
                    .returning(
                        MAILS.c.id,
                        MAILS.c.kind,
                        MAILS.c.address,
                        MAILS.c.account_id,
                        MAILS.c.member_id,
                        MAILS.c.attempts,
                    )
                ).first()
                if row is not None:
                    claimed.append(Claimed(**row._mapping))
            session.commit()
        return claimed

    def deliver(self, mail: Claimed) -> int:
        """One mail: its links made (committed), then sent, then its outcome recorded; 1 when
        it was sent."""
        now = self.clock.now()
        with self.database.unit_of_work() as session:
            memberships = self.memberships(session, mail)
            if not memberships:
                self.finish(session, mail, NO_MEMBER, now)
                session.commit()
                return 0
            links = [
                sessions.create_link(session, m.account_id, self.base_url, now, m.member_id)
                for m in memberships
            ]
            session.commit()
        message = self.compose(mail, memberships, links)
        try:
            smtp.send(self.target, message)
        except smtp.SendFailed as error:
            self.failed(mail, str(error))
            return 0
        with self.database.unit_of_work() as session:
            self.finish(session, mail, SENT, self.clock.now())
            session.commit()
        return 1

    def memberships(self, session: Session, mail: Claimed) -> list[Membership]:
        """Whom the mail signs in: every current member with the address (a sign-in request,
        in every account: on a cluster a query of every shard, as rare as the requests), or
        the member just added if it is still there."""
        query = (
            select(
                MEMBERS.c.account_id,
                ACCOUNTS.c.name.label("account_name"),
                MEMBERS.c.id.label("member_id"),
                MEMBERS.c.email,
                MEMBERS.c.role,
            )
            .join(ACCOUNTS, ACCOUNTS.c.id == MEMBERS.c.account_id)
            .where(MEMBERS.c.removed_at.is_(None))
            .order_by(ACCOUNTS.c.name, MEMBERS.c.account_id)
        )
        if mail.kind == SIGN_IN:
            query = query.where(MEMBERS.c.email_key == mail.address)
        else:
            query = query.where(
                MEMBERS.c.account_id == mail.account_id, MEMBERS.c.id == mail.member_id
            )
        return [Membership(**row._mapping) for row in session.execute(query)]

    def compose(
        self,
        mail: Claimed,
        memberships: Sequence[Membership],
        links: Sequence[sessions.SignInLink],
    ) -> EmailMessage:
        until = format_timestamp(links[0].expires_at)
        lines = []
        if mail.kind == MEMBER_ADDED:
            (member,) = memberships
            lines += [
                f"You were added to the account {member.account_name} ({member.account_id}) "
                f"as {member.role}.",
                "",
                "Sign in to its billing portal with this link:",
                "",
                links[0].url,
            ]
            subject = f"You were added to {member.account_name}'s billing portal"
        else:
            lines += [
                "Someone asked for a sign-in link to the billing portal for this address.",
                "",
            ]
            for member, link in zip(memberships, links, strict=True):
                lines += [
                    f"Account {member.account_name} ({member.account_id}), as {member.role}:",
                    link.url,
                    "",
                ]
            subject = "Your sign-in link to the billing portal"
        lines += [
            "",
            f"A link signs in once, until {until} (15 minutes). If you did not ask for it,",
            "ignore this mail: nothing happens without the link.",
        ]
        message = EmailMessage()
        message["From"] = self.sender
        message["To"] = memberships[0].email
        message["Subject"] = subject
        message["Message-ID"] = make_msgid(domain=self.sender.rpartition("@")[2].strip(">"))
        message.set_content("\n".join(lines) + "\n")
        return message

    def failed(self, mail: Claimed, error: str) -> None:
        now = self.clock.now()
        with self.database.unit_of_work() as session:
            if mail.attempts > len(RETRY_SCHEDULE):
                log.error("giving up the sign-in mail %s: %s", mail.id, error)
                self.finish(session, mail, FAILED, now, error)
            else:
                log.warning("sign-in mail %s not sent (retried): %s", mail.id, error)
                session.execute(
                    update(MAILS)
                    .where(MAILS.c.id == mail.id, MAILS.c.attempts == mail.attempts)
                    .values(
                        next_attempt_at=now + RETRY_SCHEDULE[mail.attempts - 1],
                        last_error=error[:500],
                    )
                )
            session.commit()

    def finish(
        self, session: Session, mail: Claimed, outcome: str, now: datetime, error: str = ""
    ) -> None:
        """The mail's outcome, recorded only by the claim that made the attempt."""
        session.execute(
            update(MAILS)
            .where(MAILS.c.id == mail.id, MAILS.c.attempts == mail.attempts)
            .values(
                outcome=outcome,
                finished_at=now,
                next_attempt_at=None,
                last_error=error[:500] or None,
            )
        )
