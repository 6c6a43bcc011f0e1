"""Which backend URLs the admin API may add at run time.

Adding a backend makes the proxy fetch `/health`, `/metrics` and `/v1/models` there and send it
clients' prompts and headers, so an open admin API would be a way to make the proxy reach any
address it can (SSRF). A run-time URL must have an allowed scheme, carry no credentials, and
name a host allowed by `backend_url_allow`: an IP inside a listed CIDR, a name matching a listed
pattern, or a name whose every resolved address is inside a listed CIDR. Link-local addresses
(cloud metadata services) are refused unless `backend_url_allow_link_local` is set, which
allows them all; unspecified and multicast addresses always are.

The check is made when the backend is added; a name that later resolves elsewhere is not
checked again (list such names by pattern only if their DNS is trusted).
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

RESOLVE_TIMEOUT_S = 2.0


def parse_allow_entry(entry: str) -> IPNetwork | str:
    """A CIDR (or a bare address) as a network; else a host name pattern, lower-cased."""
    entry = entry.strip()
    if not entry:
        raise ValueError("empty entry")
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        pass
    if any(c.isspace() or c in "/@:" for c in entry) or not entry.isascii():
        raise ValueError(f"{entry!r} is neither a CIDR nor a host name pattern")
    return entry.lower()


@dataclass(frozen=True, slots=True)
class UrlPolicy:
    networks: tuple[IPNetwork, ...]
    patterns: tuple[str, ...]
    schemes: frozenset[str]
    allow_link_local: bool

    @classmethod
    def build(
        cls, allow: Sequence[str], schemes: Sequence[str], allow_link_local: bool
    ) -> UrlPolicy:
        nets: list[IPNetwork] = []
        patterns: list[str] = []
        for entry in allow:
            parsed = parse_allow_entry(entry)
            if isinstance(parsed, str):
                patterns.append(parsed)
            else:
                nets.append(parsed)
        return cls(tuple(nets), tuple(patterns), frozenset(schemes), allow_link_local)

    def check_syntax(self, url: str) -> tuple[str | None, str]:
        """(why refused or None, host). The host is lower-cased, without brackets."""
        parts = urlsplit(url)
        if parts.scheme not in self.schemes:
            return f"scheme {parts.scheme!r} is not allowed ({', '.join(sorted(self.schemes))})", ""
        if parts.username is not None or parts.password is not None:
            return "credentials in the URL are not allowed", ""
        host = (parts.hostname or "").lower()
        if not host:
            return "the URL has no host", ""
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            return "the URL's port is not a number in 0-65535", ""
        return None, host

    def check_address(self, address: IPAddress) -> str | None:
        """Why an address is refused, or None."""
        if address.is_unspecified or address.is_multicast:
            return f"address {address} is never a backend"
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return self.check_address(address.ipv4_mapped)
        if address.is_link_local:
            if self.allow_link_local:
                return None
            return f"address {address} is link-local (set backend_url_allow_link_local to allow)"
        if not any(address in net for net in self.networks):
            return f"address {address} is not inside backend_url_allow"
        return None

    def matches_pattern(self, host: str) -> bool:
        return any(fnmatch.fnmatchcase(host, p) for p in self.patterns)


def is_loopback(host: str) -> bool:
    """Whether a client address (as the server reports it) is this machine's loopback."""
    address = _as_address(host.split("%", 1)[0])
    if address is None:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def listens_on_loopback(host: str) -> bool:
    """Whether a listen address (the `host` setting) is reachable from this machine only. A
    host name other than `localhost` may resolve anywhere: it counts as exposed."""
    return host == "localhost" or is_loopback(host)


def _as_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def refuse_reason(policy: UrlPolicy, url: str) -> str | None:
    """Why `url` may not be added as a backend at run time, or None when it may."""
    why, host = policy.check_syntax(url)
    if why is not None:
        return why
    return await refuse_host_reason(policy, host)


async def refuse_kv_events_reason(policy: UrlPolicy, endpoint: str) -> str | None:
    """Why a backend added at run time may not name `endpoint` (a `tcp://HOST:PORT` the proxy
    would connect to) for its KV-cache events, or None when it may: its host passes as a
    backend URL's would. A local socket (ipc://) only comes from the settings."""
    if not endpoint.startswith("tcp://"):
        return "only tcp:// KV-events endpoints may be added at run time"
    host = endpoint[len("tcp://") :].rpartition(":")[0].strip("[]").lower()
    return await refuse_host_reason(policy, host)


async def refuse_host_reason(policy: UrlPolicy, host: str) -> str | None:
    """Why a host (lower case, no brackets) may not be a backend's, or None when it may."""
    address = _as_address(host)
    if address is not None:
        return policy.check_address(address)
    if policy.matches_pattern(host):
        return None
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM),
            RESOLVE_TIMEOUT_S,
        )
    except (OSError, TimeoutError) as e:
        return f"host {host!r} does not resolve ({type(e).__name__})"
    addresses = {str(info[4][0]).split("%", 1)[0] for info in infos}
    if not addresses:
        return f"host {host!r} does not resolve"
    for text in sorted(addresses):
        resolved = _as_address(text)
        if resolved is None:
            return f"host {host!r} resolved to {text!r}"
        why = policy.check_address(resolved)
        if why is not None:
            return f"host {host!r} resolves to {resolved}: {why}"
    return None
