"""What the Twisted clients do with an address that is the wrong port.

The rule that names a wrong peer is :func:`txnsq._wire.handshake.wrong_peer` (one place,
used by every driver); this module holds the two client-side pieces around it:

- :class:`WrongPeers`, kept by a :class:`~txnsq.producer.Producer`: which of its
  addresses answered like a wrong port the last time it connected, so that the error is
  logged once per outage (not at every reconnect) and publishes fail at once with it
  when every address is wrong, instead of waiting ``ready_timeout`` for a connection
  that cannot come;
- :func:`lookupd_wrong_port`: an nsqlookupd HTTP request answered the way an NSQ TCP
  port answers (nsqd's and nsqlookupd's TCP ports answer an HTTP request with
  ``E_BAD_PROTOCOL`` and close: Twisted's HTTP client sees no status line) becomes a
  :class:`~txnsq.errors.WrongPeerError` saying which address was probably meant.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from txnsq._wire.handshake import not_an_http_port
from txnsq.errors import WrongPeerError

__all__ = ["WrongPeers", "lookupd_wrong_port"]


class WrongPeers:
    """The addresses of a client whose last connection attempt met a wrong peer.

    :param addresses: how many addresses the client connects to.
    :param fail_waiting: called with the error when every address is a wrong peer (fail
        the publishes waiting for a connection).
    :param log: the client's logger.
    """

    def __init__(
        self, addresses: int, fail_waiting: Callable[[Exception], object], log: Logger
    ) -> None:
        self._addresses = addresses
        self._fail_waiting = fail_waiting
        self._log = log
        self._errors: dict[str, WrongPeerError] = {}

    def handshake_failed(self, address: str, error: BaseException | None) -> bool:
        """A connection to ``address`` failed its handshake with ``error``. Return whether
        it was a wrong peer (then it has been dealt with: logged at its first failure of
        an outage, and the waiting publishes failed when every address is wrong); for any
        other error, ``False`` (the client logs it as any failed handshake)."""
        if not isinstance(error, WrongPeerError):
            self._errors.pop(address, None)
            return False
        previous = self._errors.get(address)
        self._errors[address] = error
        if previous is None or str(previous) != str(error):
            self._log.error(
                "nsqd address {address} is the wrong port: {error} (connecting again as "
                "before; logged once until it connects)",
                address=address,
                error=error,
            )
        if len(self._errors) >= self._addresses:
            self._fail_waiting(error)
        return True

    def connected(self, address: str) -> None:
        """A connection to ``address`` completed its handshake: the outage is over."""
        self._errors.pop(address, None)

    def error(self) -> WrongPeerError | None:
        """The error to fail a publish with at once (every address is a wrong peer), or
        ``None``."""
        if self._errors and len(self._errors) >= self._addresses:
            return next(reversed(self._errors.values()))
        return None


def lookupd_wrong_port(
    failure: Failure, address: str, meant: str = "nsqlookupd's HTTP address (usually 4161)"
) -> Failure:
    """Return ``failure`` of an nsqlookupd HTTP request to ``address``, named when the
    peer answered like an NSQ TCP port: a :class:`~twisted.web.client.ResponseFailed`
    with no response (no HTTP status line came) whose connection was lost, as with
    nsqd's and nsqlookupd's TCP ports, becomes a
    :class:`~txnsq.errors.WrongPeerError` (kind ``"nsq-tcp"``). Any other failure is
    returned as it is."""
    error = failure.value
    if (
        isinstance(error, ResponseFailed)
        and not isinstance(error, ResponseNeverReceived)  # nothing came: not known
        and getattr(error, "response", None) is None
        and any(
            isinstance(getattr(reason, "value", None), ConnectionLost | ConnectionDone)
            for reason in error.reasons
        )
    ):
        return Failure(not_an_http_port(address, meant))  # type: ignore[no-untyped-call]
    return failure
