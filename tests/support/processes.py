"""Run real ``nsqd`` and ``nsqlookupd`` processes for integration tests: the public
helpers of :mod:`txnsq.testing` (:class:`~txnsq.testing.NSQDProcess`,
:class:`~txnsq.testing.LookupdProcess`), with what this suite adds to them.

The binaries come from ``$NSQ_BIN_DIR`` (``scripts/install-nsq`` builds each nsq version
into ``.nsq/<version>/bin``; ``.nsq/bin``, the default here, links to v1.3.0's), else
``PATH``. When they are missing a test is skipped, except under ``CI=true``, where that
is a failure: CI must never pass by skipping the integration suite.

The suite runs against several nsqd versions (``scripts/test``: v1.3.0, v1.2.1, v1.2.0).
A test that depends on what a version does asks :func:`nsqd_version` (``nsqd --version``,
run once per session) and expects what that version does.

What this module adds: the skip-or-fail above, the check that a test starting a process
carries the ``integration`` marker, blocking HTTP helpers that return nsqd's JSON as it
is (:meth:`NSQD.stats`, :meth:`NSQD.http_publish`, :meth:`NSQLookupd.lookup`, ...), and
:class:`ProcessGroup`, the processes of one test or one benchmark closed together.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import re
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Protocol, TypeVar
from unittest import SkipTest

# Re-exported: the integration tests import them from here.
from tests.support.env import LOOPBACK as LOOPBACK
from tests.support.env import REPO as REPO
from tests.support.env import free_port as free_port
from tests.support.env import in_ci as in_ci
from txnsq.testing import (
    BinaryNotFoundError,
    LookupdProcess,
    NSQDProcess,
    NSQProcess,
    find_binary,
)
from txnsq.testing._binaries import BIN_DIR_VARIABLE

#: Set by ``tests/conftest.py`` for each test pytest runs: whether it is marked
#: ``integration`` (``None`` outside pytest: anything goes).
marked_integration: bool | None = None


def bin_dir() -> str | None:
    """Where the suite's nsq binaries are, as :func:`~txnsq.testing.find_binary` takes
    it: ``None`` (``$NSQ_BIN_DIR``, which find_binary reads and names itself) when that is
    set, else ``.nsq/bin`` when it has them, else ``None`` (``PATH``)."""
    if os.environ.get(BIN_DIR_VARIABLE):
        return None
    default = REPO / ".nsq" / "bin"
    return str(default) if (default / "nsqd").is_file() else None


def nsq_binary(name: str) -> str:
    """Return the path of an nsq tool, or skip (fail under CI) when it is missing."""
    try:
        return find_binary(name, bin_dir())
    except BinaryNotFoundError as e:
        if in_ci():
            raise RuntimeError(f"CI=true and {e}") from e
        raise SkipTest(str(e)) from e


@functools.cache
def nsqd_version() -> tuple[int, int, int]:
    """The version of the nsqd the tests start, e.g. ``(1, 2, 1)``.

    Asked once per test session (``nsqd --version``, which prints
    ``nsqd v1.2.1 (built w/go1.26.8)``). Skips, or fails under ``CI=true``, like
    :func:`nsq_binary` when nsqd is missing.
    """
    out = subprocess.run(
        [nsq_binary("nsqd"), "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    match = re.search(r"\bv?(\d+)\.(\d+)\.(\d+)", out)
    if match is None:
        raise RuntimeError(f"cannot read a version in `nsqd --version`: {out!r}")
    major, minor, patch = (int(part) for part in match.groups())
    return (major, minor, patch)


def nsqd_version_text() -> str:
    """:func:`nsqd_version` as nsqd writes it in IDENTIFY and ``/info``: ``"1.2.1"``."""
    return ".".join(str(part) for part in nsqd_version())


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return bytes(response.read())


def http_post(url: str, body: bytes = b"", timeout: float = 5.0) -> bytes:
    request = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return bytes(response.read())


#: The first nsqd version that listens on unix sockets (nsq #1434).
UNIX_SOCKETS_SINCE = (1, 3, 0)


def require_unix_sockets() -> None:
    """Skip unless the nsqd under test listens on unix sockets (v1.3.0 and later).

    Only an older nsqd is a reason to skip (``scripts/test`` runs the suite against
    v1.2.x too); a missing nsqd is :func:`nsq_binary`'s (a failure under ``CI=true``).
    """
    version = nsqd_version()
    if version < UNIX_SOCKETS_SINCE:
        raise SkipTest(
            f"nsqd {'.'.join(map(str, version))} has no unix-socket listeners (nsqd "
            f"{'.'.join(map(str, UNIX_SOCKETS_SINCE))} added them)"
        )


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def unix_http(
    path: str, method: str, target: str, body: bytes | None = None, timeout: float = 5.0
) -> bytes:
    """``method target`` over the HTTP server on the unix socket ``path``; the body of a
    2xx answer (else :class:`urllib.error.HTTPError`, as :func:`http_get` raises)."""
    conn = _UnixHTTPConnection(path, timeout)
    try:
        conn.request(method, target, body=body)
        response = conn.getresponse()
        data = response.read()
        if not 200 <= response.status < 300:
            raise urllib.error.HTTPError(
                f"unix:{path}{target}", response.status, response.reason, response.msg, None
            )
        return data
    finally:
        conn.close()


class _Addressed(Protocol):
    @property
    def http_address(self) -> str: ...

    @property
    def http_url(self) -> str: ...


class _HTTP:
    """The HTTP helpers both daemons have here (blocking; fine in test bodies, keep them
    off hot loops). A mixin after the process class: its addresses are the process's."""

    @property
    def http_url(self: _Addressed) -> str:
        path = getattr(self, "http_socket", None)
        if path is not None:
            raise AttributeError(f"{self} serves HTTP on unix socket {path}")
        return f"http://{self.http_address}"

    def http_request(
        self: _Addressed, method: str, target: str, body: bytes | None = None,
        timeout: float = 5.0,
    ) -> bytes:
        """``method target`` (path and query) on the HTTP API, TCP or unix socket."""
        path = getattr(self, "http_socket", None)
        if path is not None:
            return unix_http(path, method, target, body, timeout)
        if method == "GET":
            return http_get(self.http_url + target, timeout)
        return http_post(self.http_url + target, body or b"", timeout)


def _check_marked(program: str) -> None:
    if marked_integration is False:
        # scripts/test selects the runs against the other nsqd versions with the
        # marker: an unmarked test would silently be left out of them.
        raise RuntimeError(
            f"a test that starts {program} must be marked integration "
            "(pytestmark = pytest.mark.integration, or @pytest.mark.integration on its "
            "class)"
        )


class NSQLookupd(LookupdProcess, _HTTP):
    """:class:`~txnsq.testing.LookupdProcess` with this suite's checks and helpers."""

    def start(self) -> None:
        _check_marked(self.program)
        super().start()

    def lookup(self, topic: str) -> dict[str, Any]:
        url = f"{self.http_url}/lookup?" + urllib.parse.urlencode({"topic": topic})
        try:
            return dict(json.loads(http_get(url)))
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return {"channels": [], "producers": []}
            raise


class NSQD(NSQDProcess, _HTTP):
    """:class:`~txnsq.testing.NSQDProcess` with this suite's checks and helpers."""

    def start(self) -> None:
        _check_marked(self.program)
        super().start()

    def stats(self, topic: str | None = None, channel: str | None = None) -> dict[str, Any]:
        query = {"format": "json"}
        if topic:
            query["topic"] = topic
        if channel:
            query["channel"] = channel
        return dict(json.loads(self.http_request("GET", "/stats?" + urllib.parse.urlencode(query))))

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        for t in self.stats(topic=topic).get("topics") or []:
            if t["topic_name"] == topic:
                return dict(t)
        return None

    def channel_stats(self, topic: str, channel: str) -> dict[str, Any] | None:
        t = self.topic_stats(topic)
        for c in (t or {}).get("channels") or []:
            if c["channel_name"] == channel:
                return dict(c)
        return None

    def create_topic(self, topic: str) -> None:
        self.http_request("POST", "/topic/create?" + urllib.parse.urlencode({"topic": topic}))

    def create_channel(self, topic: str, channel: str) -> None:
        q = urllib.parse.urlencode({"topic": topic, "channel": channel})
        self.http_request("POST", f"/channel/create?{q}")

    def http_publish(self, topic: str, body: bytes) -> None:
        self.http_request("POST", "/pub?" + urllib.parse.urlencode({"topic": topic}), body)

    def http_mpublish(self, topic: str, bodies: list[bytes]) -> None:
        """Publish with ``/mpub?binary=true`` (bodies may contain newlines)."""
        payload = struct.pack(">l", len(bodies)) + b"".join(
            struct.pack(">l", len(b)) + b for b in bodies
        )
        q = urllib.parse.urlencode({"topic": topic, "binary": "true"})
        self.http_request("POST", f"/mpub?{q}", payload)


class ProcessGroup:
    """Processes started for one test (or one class, or one benchmark); :meth:`stop_all`
    closes them all (stops them, deletes their directories)."""

    def __init__(self) -> None:
        self.processes: list[NSQProcess] = []

    def lookupd(self, extra_args: list[str] | None = None) -> NSQLookupd:
        return self._started(NSQLookupd(args=extra_args or (), bin_dir=bin_dir_of("nsqlookupd")))

    def nsqd(
        self,
        extra_args: list[str] | None = None,
        lookupds: list[NSQLookupd] | None = None,
        *,
        unix_sockets: bool = False,
    ) -> NSQD:
        """Start an nsqd; with ``unix_sockets`` it listens on ``nsqd.sock`` and
        ``http.sock`` in its directory (HTTPS stays on a port), or the test is skipped
        for an nsqd older than v1.3.0 (:func:`require_unix_sockets`)."""
        if unix_sockets:
            require_unix_sockets()
        nsqd = NSQD(
            args=extra_args or (),
            lookupds=lookupds or (),
            unix_sockets=unix_sockets,
            bin_dir=bin_dir_of("nsqd"),
        )
        return self._started(nsqd)

    def _started(self, process: _P) -> _P:
        self.processes.append(process)
        process.start()
        return process

    def stop_all(self) -> None:
        for p in reversed(self.processes):
            try:
                p.close()
            except Exception:
                pass


_P = TypeVar("_P", bound=NSQProcess)


def bin_dir_of(program: str) -> str:
    """The directory of ``program`` (skipping the test, or failing under CI, when it is
    missing)."""
    return os.path.dirname(nsq_binary(program))


def start_nsqd(
    testcase: Any,
    extra_args: list[str] | None = None,
    lookupds: list[NSQLookupd] | None = None,
    *,
    unix_sockets: bool = False,
) -> NSQD:
    """Start an nsqd for ``testcase`` (a trial/unittest TestCase) and close it in cleanup
    (``unix_sockets``: see :meth:`ProcessGroup.nsqd`)."""
    group = ProcessGroup()
    testcase.addCleanup(group.stop_all)
    return group.nsqd(extra_args, lookupds, unix_sockets=unix_sockets)


def start_lookupd(testcase: Any, extra_args: list[str] | None = None) -> NSQLookupd:
    """Start an nsqlookupd for ``testcase`` and close it in cleanup."""
    group = ProcessGroup()
    testcase.addCleanup(group.stop_all)
    return group.lookupd(extra_args)


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05, what: str = "") -> Any:
    """Poll ``predicate()`` (blocking) until it returns something truthy, or fail."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)
