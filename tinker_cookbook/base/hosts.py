"""Which hosts are this machine's own: the server binds beyond them only with an API key, and a client sends
no key to them unless given one."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only the loopback interface (``localhost``, 127.0.0.0/8, ``::1``, ``[::1]``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to any interface
