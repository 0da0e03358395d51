"""Which ``Host`` names a local HTTP server (the dashboard, ``emqfast metrics --serve``)
answers: its defence against DNS rebinding.

A web page on ``evil.example`` can make its name resolve to 127.0.0.1 and then read and
post to a server on this machine with the browser's help; the browser still sends
``Host: evil.example``. So a request is served only when its Host is a loopback name or
address, the address the server was bound to, or a name the operator allowed
(``--allowed-host``); ``*`` allows any (a proxy in front checks it instead).
"""
from __future__ import annotations

import ipaddress
import socket
from typing import Iterable, Optional, Set

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})
ANY = "*"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def is_wildcard(host: str) -> bool:
    """Whether ``host`` binds every interface (``0.0.0.0``, ``::``, empty)."""
    try:
        return ipaddress.ip_address(host.strip("[]") or "0.0.0.0").is_unspecified
    except ValueError:
        return False


def host_name(header: Optional[str]) -> Optional[str]:
    """The host part of a ``Host`` header or an origin's netloc, lower case, without the
    port or IPv6 brackets (``[::1]:8270`` -> ``::1``); None when malformed."""
    if not header:
        return None
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1:] and not value[end + 1:].startswith(":")):
            return None
        return value[1:end]
    name = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    if not name or any(c in name for c in "/@ \\") or value.count(":") > 1:
        return None
    return name.rstrip(".")


def _own_addresses() -> Set[str]:
    """This machine's name and its addresses (a server bound to every interface is
    reached by them)."""
    found = {socket.gethostname().lower()}
    try:
        found |= {str(info[4][0]).lower()
                  for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        pass
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:  # the address outbound traffic leaves from (a UDP connect sends nothing)
            with socket.socket(family, socket.SOCK_DGRAM) as udp:
                udp.connect((probe, 9))
                found.add(str(udp.getsockname()[0]).lower())
        except OSError:
            pass
    return found


def bound_names(host: str) -> Set[str]:
    """The Host names a server bound to ``host`` is reached by: that address or name, or
    this machine's name and addresses when bound to every interface."""
    return _own_addresses() if is_wildcard(host) else {host.lower().strip("[]")}


class AllowedHosts:
    """The Host names one server answers: the loopback ones, and ``names`` (a name or an
    address each; ``*`` answers any)."""

    def __init__(self, names: Iterable[str] = ()):
        if isinstance(names, str):  # one name, not its letters
            names = [names]
        found = {str(h).strip().lower().strip("[]").rstrip(".") for h in names if str(h).strip()}
        self.any = ANY in found
        self.names = frozenset(found - {ANY})

    def allows(self, header: Optional[str]) -> bool:
        """Whether a request with this ``Host`` header may be served."""
        if self.any:
            return True
        name = host_name(header)
        return name is not None and (name in self.names or is_loopback(name))
