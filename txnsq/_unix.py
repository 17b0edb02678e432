"""What went wrong dialling a unix-domain socket, in words naming its path.

Shared by the Twisted clients (:mod:`txnsq._endpoints`, :mod:`txnsq.http`) and the
blocking ones: a failed connect to ``unix:/path`` says whether the path is missing, is
not a socket, or is a socket nobody listens on (a file left by an nsqd that exited).
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = [
    "UnixSocketUnreachable",
    "describe_unix_failure",
    "unix_tls_needs_hostname",
    "unreachable",
]


class UnixSocketUnreachable(ConnectionError):
    """A connect to a unix socket failed; ``str()`` names the path and why."""

    def __init__(self, path: str, description: str) -> None:
        super().__init__(description)
        #: the socket's path.
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0])


def describe_unix_failure(path: str, reason: BaseException | None = None) -> str:
    """Why connecting to the unix socket at ``path`` failed (``reason``: the error of
    the connect), from what is at ``path`` now."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"unix socket {path!r} does not exist"
    except NotADirectoryError:
        return f"unix socket {path!r} does not exist (a parent is not a directory)"
    except PermissionError:
        return f"no permission to reach unix socket {path!r}"
    except OSError as e:
        return f"cannot reach unix socket {path!r}: {e.strerror or e}"
    if not stat.S_ISSOCK(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(
            mode
        ) else "not a socket"
        return f"{path!r} is not a unix socket ({kind})"
    code = getattr(reason, "errno", None) or getattr(reason, "osError", None)
    if isinstance(reason, PermissionError) or code in (errno.EACCES, errno.EPERM):
        return f"no permission to connect to unix socket {path!r}"
    if reason is None or isinstance(reason, ConnectionRefusedError) or code == errno.ECONNREFUSED:
        return (
            f"nothing listens on unix socket {path!r} (connection refused; a socket file "
            "left by a process that exited?)"
        )
    return f"cannot connect to unix socket {path!r}: {reason}"


def unreachable(path: str, reason: BaseException | None = None) -> UnixSocketUnreachable:
    """:class:`UnixSocketUnreachable` for ``path`` (see :func:`describe_unix_failure`)."""
    return UnixSocketUnreachable(path, describe_unix_failure(path, reason))


def unix_tls_needs_hostname(label: str) -> str:
    """The one message for TLS over the unix socket ``label`` (``"unix:/path"``) without
    ``TLSOptions.hostname``."""
    return (
        f"TLS over unix socket {label!r} needs TLSOptions(hostname=...): there is no host "
        "to check nsqd's certificate against"
    )
