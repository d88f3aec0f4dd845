"""Where webhooks may go: the URL a job or batch names, the allowed hosts, the addresses they
resolve to.

A webhook URL is checked twice:

- at submission (`check_submission` for a job, `check_submitted_url` for a batch): webhooks
  are configured on this gateway, the URL is `http(s)://host[:port]/path` without
  credentials, its host is on `TOKENRELAY_WEBHOOK_ALLOWED_HOSTS`, and an IP-literal host is a
  public address; a refusal is a 400 naming `webhook`;
- before every delivery attempt (`resolve_target`): the same URL checks against the current
  settings, then the host is resolved and every address it resolves to is checked. The request
  is then sent to one of those checked addresses (`pinned_request`) with the original `Host`
  header, and for https the original name as TLS server name (SNI and certificate check), so a
  DNS answer that changes between the check and the connection (DNS rebinding) cannot send it
  elsewhere.

Refused addresses: loopback, private, link-local (cloud metadata included), shared (CGNAT),
reserved, documentation and other non-global ranges, IPv4 embedded in IPv6 (mapped, 6to4) when
the IPv4 address is refused, and always the unspecified address and multicast.
`TOKENRELAY_WEBHOOK_ALLOW_PRIVATE=1` lifts all but the last two, for receivers on a private
network (and tests on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.jobs import JobField
from tokenrelay.shared.settings import Settings

WEBHOOK_EVENTS = ("start", "completed")
MAX_URL_LENGTH = 2048
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
"""Resolves (host, port) to addresses; `resolve_host` uses the system resolver."""


class WebhookRefused(Exception):
    """The policy forbids this webhook target; the message says why."""


@dataclass(frozen=True)
class WebhookTarget:
    """A checked webhook of one job: where to send, and which events."""

    url: str
    events: tuple[str, ...]

    def hash_fields(self) -> dict[str, str]:
        """The job hash fields the Lua library reads (`webhook`, `webhook_events`)."""
        return {JobField.WEBHOOK: self.url, JobField.WEBHOOK_EVENTS: ",".join(self.events)}


def webhooks_unavailable(settings: Settings) -> str | None:
    """Why this gateway cannot send webhooks, or None when it can."""
    if not settings.webhook_allowed_hosts:
        return "webhooks are disabled on this gateway (TOKENRELAY_WEBHOOK_ALLOWED_HOSTS is empty)"
    if settings.webhook_secret is None:
        return (
            "webhooks need a signing secret and this gateway has none "
            "(TOKENRELAY_WEBHOOK_SECRET is not set)"
        )
    return None


def check_submission(settings: Settings, url: str, events: Sequence[str] | None) -> WebhookTarget:
    """Validate the webhook fields of `POST /v1/jobs`; raises `InvalidRequest` (400)."""
    check_submitted_url(settings, url)
    if events is not None and not events:
        raise InvalidRequest(
            f"`webhook_events_filter` must name at least one of {', '.join(WEBHOOK_EVENTS)}",
            param="webhook_events_filter",
        )
    chosen = WEBHOOK_EVENTS if events is None else tuple(e for e in WEBHOOK_EVENTS if e in events)
    return WebhookTarget(url=url, events=chosen)


def check_submitted_url(settings: Settings, url: str) -> None:
    """Validate a submitted `webhook` (of a job or a batch); raises `InvalidRequest` (400)."""
    unavailable = webhooks_unavailable(settings)
    if unavailable is not None:
        raise InvalidRequest(unavailable, param="webhook")
    try:
        check_url(url, settings)
    except WebhookRefused as exc:
        raise InvalidRequest(f"`webhook` {exc}", param="webhook") from None


def check_url(url: str, settings: Settings) -> httpx.URL:
    """Parse and check a webhook URL (no DNS); raises `WebhookRefused`."""
    if len(url) > MAX_URL_LENGTH:
        raise WebhookRefused(f"must be at most {MAX_URL_LENGTH} characters, got {len(url)}")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise WebhookRefused(f"is not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise WebhookRefused(f"must be an http or https URL, got {parsed.scheme or 'none'!r}")
    host = ascii_host(parsed)
    if not host:
        raise WebhookRefused("must name a host")
    literal = _ip_literal(host)
    if literal is None and not _is_hostname(host):
        raise WebhookRefused(f"host {host!r} is not a valid host name")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise WebhookRefused(f"port must be 1 to 65535, got {parsed.port}")
    if parsed.userinfo:
        raise WebhookRefused("must not carry credentials; deliveries are signed instead")
    if parsed.fragment:
        raise WebhookRefused("must not have a fragment (`#...`)")
    if not host_allowed(host, settings.webhook_allowed_hosts):
        raise WebhookRefused(
            f"host {host!r} is not on this gateway's allow-list (TOKENRELAY_WEBHOOK_ALLOWED_HOSTS)"
        )
    if literal is not None:
        reason = address_refusal(literal, allow_private=settings.webhook_allow_private)
        if reason is not None:
            raise WebhookRefused(f"host {host} is {reason}")
    return parsed


def ascii_host(url: httpx.URL) -> str:
    """The URL's host as DNS sees it: IDNA-encoded, lower case, without a final dot."""
    return url.raw_host.decode("ascii").lower().rstrip(".")


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """`host` equals an entry, or ends with an entry that starts with a dot (`.example.com`
    allows `a.example.com` and `b.a.example.com`, not `example.com` itself)."""
    host = host.lower().rstrip(".")
    for entry in allowed:
        if entry.startswith("."):
            if host.endswith(entry) and len(host) > len(entry):
                return True
        elif host == entry:
            return True
    return False


def address_refusal(address: IPAddress, *, allow_private: bool) -> str | None:
    """Why a delivery must not connect to `address`, or None when it may."""
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_multicast:
        return "a multicast address"
    if allow_private:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is not None:
            reason = address_refusal(embedded, allow_private=False)
            return None if reason is None else f"{reason} (embedded in {address})"
    checks = (
        (address.is_loopback, "a loopback address"),
        (address.is_link_local, "a link-local address"),
        (address.is_private, "a private address"),
        (address.is_reserved, "a reserved address"),
        (not address.is_global, "not a public address"),
    )
    for refused, reason in checks:
        if refused:
            return reason
    return None


async def resolve_host(host: str, port: int) -> list[IPAddress]:
    """Every address the system resolver gives for `host` (TCP), in its order, no duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


async def resolve_target(
    url: str, settings: Settings, resolver: Resolver
) -> tuple[httpx.URL, list[IPAddress]]:
    """Check the URL, resolve its host and check every address; raises `WebhookRefused`
    (permanent) or `OSError` (resolution failed: worth a retry)."""
    parsed = check_url(url, settings)
    host = ascii_host(parsed)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    literal = _ip_literal(host)
    addresses = [literal] if literal is not None else await resolver(host, port)
    if not addresses:
        raise OSError(f"{host} resolved to no address")
    for address in addresses:
        reason = address_refusal(address, allow_private=settings.webhook_allow_private)
        if reason is not None:
            raise WebhookRefused(f"host {host} resolves to {address}, {reason}")
    return parsed, addresses


def pinned_request(
    client: httpx.AsyncClient,
    url: httpx.URL,
    address: IPAddress,
    headers: Mapping[str, str],
    body: bytes,
) -> httpx.Request:
    """A POST of `body` to `url` that connects to `address`, keeping `Host` and TLS name."""
    host_header = url.netloc.decode("ascii")
    extensions = {"sni_hostname": ascii_host(url)} if url.scheme == "https" else {}
    return client.build_request(
        "POST",
        url.copy_with(host=str(address)),
        headers={**headers, "Host": host_header},
        content=body,
        extensions=extensions,
    )


def _is_hostname(host: str) -> bool:
    return len(host) <= 253 and all(_LABEL.fullmatch(label) for label in host.split("."))


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
