"""Free loopback ports for the daemons :mod:`txnsq.testing` starts.

A port found free with ``bind(port 0)`` and then closed is free only for a moment: any
other ``bind(port 0)`` on the machine (another test process picking its own ports, a
client binding before it connects) may be handed it before the daemon binds it.
:func:`reserve_port` narrows that window: it makes the port's last connection end on
the listening side, which leaves a ``TIME_WAIT`` entry for the port in the kernel for
about a minute. While that entry exists the kernel hands the port to no other
``bind(port 0)``, yet a server that sets ``SO_REUSEADDR`` (every Go program, nsqd and
nsqlookupd among them) binds it at once. What is left of the race (a program binding
that exact port by number) is handled by the caller: a daemon that finds its port taken
is started again on new ports.

Private: the public face is :mod:`txnsq.testing`.
"""

from __future__ import annotations

import socket

__all__ = ["LOOPBACK", "reserve_port"]

#: The only address the daemons listen on.
LOOPBACK = "127.0.0.1"


def reserve_port(host: str = LOOPBACK) -> int:
    """Return a TCP port of ``host`` that is free and held back from other
    ``bind(port 0)`` calls for about a minute (see the module's notes), for a server
    that binds it with ``SO_REUSEADDR``.

    :raises OSError: when no port can be bound on ``host``.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(1)
        address = listener.getsockname()
        with socket.create_connection(address, timeout=5.0) as client:
            accepted, _ = listener.accept()
            # The side that closes first keeps the TIME_WAIT entry: the listening
            # side's, whose local port is the one reserved.
            accepted.close()
            client.recv(1)  # the close has reached the client: the entry exists
    return int(address[1])
