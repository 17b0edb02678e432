"""The flags of ``twistd nsq-consumer`` that every connection to nsqd takes: TLS
(``--tls`` and its companions), AUTH (``--auth-secret``, ``--auth-secret-file``),
compression (``--snappy``, ``--deflate``, ``--deflate-level``), ``--msg-timeout``,
``--silence-timeout``, ``--client-id`` and ``--user-agent``, read into
:class:`~txnsq.options.ConnectionOptions` fields; and the reading of a number given to a
flag, which every flag shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from twisted.python import usage

from txnsq._wire import liveness
from txnsq._wire.numbers import parse_number
from txnsq.options import ConnectionOptions
from txnsq.tls import TLSOptions

__all__ = ["connection_settings", "flag_setting", "number"]

_DEFAULTS: Final = ConnectionOptions()


def flag_setting(name: str, value: object) -> str:
    """A ConsumerOptions setting as given on the command line (``--max-in-flight 1``)."""
    return f"--{name.replace('_', '-')} {value}"


def number(
    option: str,
    text: str,
    *,
    integer: bool = False,
    positive: bool = False,
    minimum: float | None = 0,
    maximum: float | None = None,
) -> Any:
    """Parse ``text`` given to ``--option`` (:func:`~txnsq._wire.numbers.parse_number`).

    :raises usage.UsageError: naming ``--option``.
    """
    try:
        return parse_number(
            text,
            f"--{option}",
            integer=integer,
            positive=positive,
            minimum=None if positive else minimum,
            maximum=maximum,
        )
    except ValueError as e:
        raise usage.UsageError(str(e)) from None


def connection_settings(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~txnsq.options.ConnectionOptions` fields the parsed command line
    ``flags`` gives (``tls`` and ``auth_secret`` always; the others when given).

    :raises usage.UsageError: for a bad value or flags that contradict each other,
        naming the flags.
    """
    settings = _codec(flags)
    if flags["msg-timeout"] is not None:
        settings["msg_timeout"] = number("msg-timeout", flags["msg-timeout"], minimum=1)
    if flags["silence-timeout"] is not None:
        settings["silence_timeout"] = _silence_timeout(flags["silence-timeout"])
    for flag, field in (("client-id", "client_id"), ("user-agent", "user_agent")):
        if flags[flag] is not None:
            if not flags[flag]:
                raise usage.UsageError(f"--{flag} must not be empty")
            settings[field] = flags[flag]
    settings["tls"] = _tls_options(flags)
    settings["auth_secret"] = _auth_secret(flags)
    return settings


def _codec(flags: Mapping[str, Any]) -> dict[str, Any]:
    """``compression`` and ``deflate_level``, from ``--snappy``, ``--deflate`` and
    ``--deflate-level``."""
    if flags["snappy"] and flags["deflate"]:
        raise usage.UsageError("--snappy and --deflate cannot be used together")
    settings: dict[str, Any] = {
        "compression": "snappy" if flags["snappy"] else "deflate" if flags["deflate"] else None,
    }
    if flags["deflate-level"] is not None:
        if not flags["deflate"]:
            raise usage.UsageError("--deflate-level needs --deflate")
        settings["deflate_level"] = number(
            "deflate-level", flags["deflate-level"], integer=True, minimum=1, maximum=9
        )
    return settings


def _silence_timeout(text: str) -> float:
    """``--silence-timeout``, checked by the silence rule against the heartbeat interval
    (this command line's default: it has no heartbeat flag)."""

    def setting(name: str, value: object) -> str:
        if name == "heartbeat_interval":
            return f"the heartbeat interval ({value} s)"
        return flag_setting(name, value)

    silence: float = number("silence-timeout", text, positive=True)
    try:
        liveness.silence_timeout(
            _DEFAULTS.heartbeat_interval, _DEFAULTS.heartbeats_missed, silence, setting=setting
        )
    except ValueError as e:
        raise usage.UsageError(str(e)) from None
    return silence


def _tls_options(flags: Mapping[str, Any]) -> TLSOptions | None:
    given = [
        f"--{name}"
        for name in ("tls-ca", "tls-cert", "tls-key", "tls-hostname")
        if flags[name] is not None
    ]
    if flags["tls-insecure"]:
        given.append("--tls-insecure")
    if not flags["tls"]:
        if given:
            raise usage.UsageError(f"{', '.join(given)} need(s) --tls")
        return None
    if flags["tls-cert"] is not None and flags["tls-key"] is None:
        raise usage.UsageError("--tls-cert needs --tls-key")
    if flags["tls-key"] is not None and flags["tls-cert"] is None:
        raise usage.UsageError("--tls-key needs --tls-cert")
    if flags["tls-insecure"] and flags["tls-ca"] is not None:
        raise usage.UsageError(
            "--tls-insecure and --tls-ca contradict each other: insecure mode checks "
            "no certificate"
        )
    try:
        return TLSOptions(
            ca_certs=flags["tls-ca"],
            client_cert=flags["tls-cert"],
            client_key=flags["tls-key"],
            hostname=flags["tls-hostname"],
            insecure_skip_verify=bool(flags["tls-insecure"]),
        )
    except (TypeError, ValueError) as e:
        raise usage.UsageError(f"TLS options: {e}") from None


def _auth_secret(flags: Mapping[str, Any]) -> bytes | str | None:
    secret, path = flags["auth-secret"], flags["auth-secret-file"]
    if secret is not None and path is not None:
        raise usage.UsageError("give --auth-secret or --auth-secret-file, not both")
    if secret is not None:
        if not secret:
            raise usage.UsageError("--auth-secret must not be empty")
        result: str = secret
        return result
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise usage.UsageError(
            f"--auth-secret-file: cannot read {path!r}: {e.strerror or e}"
        ) from None
    data = data.rstrip(b"\r\n")
    if not data:
        raise usage.UsageError(f"--auth-secret-file: {path!r} is empty")
    return data
