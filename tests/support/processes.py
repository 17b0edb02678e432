"""Run real ``nsqd`` and ``nsqlookupd`` processes for integration tests.

The binaries come from ``$NSQ_BIN_DIR`` (``scripts/install-nsq`` builds each nsq version
into ``.nsq/<version>/bin``; ``.nsq/bin``, the default here, links to v1.3.0's). When they
are missing a test is skipped, except under ``CI=true``, where that is a failure: CI must
never pass by skipping the integration suite.

The suite runs against several nsqd versions (``scripts/test``: v1.3.0, v1.2.1, v1.2.0).
A test that depends on what a version does asks :func:`nsqd_version` (``nsqd --version``,
run once per session) and expects what that version does.

Every process listens on free ports of 127.0.0.1 only (or, for an nsqd started with
``unix_sockets=True``, on unix sockets in its temporary directory: nsqd v1.3.0 and later),
keeps its data in a temporary directory, and is stopped (by pid) in the test's cleanup.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any
from unittest import SkipTest

# Re-exported: the integration tests import them from here.
from tests.support.env import LOOPBACK as LOOPBACK
from tests.support.env import REPO as REPO
from tests.support.env import free_port as free_port
from tests.support.env import in_ci as in_ci

#: Set by ``tests/conftest.py`` for each test pytest runs: whether it is marked
#: ``integration`` (``None`` outside pytest: anything goes).
marked_integration: bool | None = None


def nsq_binary(name: str) -> str:
    """Return the path of an nsq tool, or skip (fail under CI) when it is missing."""
    bin_dir = Path(os.environ.get("NSQ_BIN_DIR") or REPO / ".nsq" / "bin")
    path = bin_dir / name
    if path.is_file() and os.access(path, os.X_OK):
        return os.path.abspath(path)  # processes start in their own working directory
    found = shutil.which(name)
    if found:
        return found
    message = f"{name} not found in {bin_dir} or on PATH; run scripts/install-nsq"
    if in_ci():
        raise RuntimeError(f"CI=true and {message}")
    raise SkipTest(message)


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


class _Process:
    """A long-running nsq process with an HTTP API answering ``/ping``."""

    #: nsqd's unix sockets (``--tcp-address`` and ``--http-address``), else ``None``.
    tcp_socket: str | None = None
    http_socket: str | None = None

    name = ""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.http_port = free_port()
        self.tcp_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(workdir, f"{self.name}.log")

    def args(self) -> list[str]:
        raise NotImplementedError

    def pick_ports(self) -> None:
        """Choose fresh free ports (only before anyone was told the current ones)."""
        self.http_port = free_port()
        self.tcp_port = free_port()

    def start_on_free_ports(self, timeout: float = 10.0, attempts: int = 5) -> None:
        """:meth:`start` for the first time: a port found free can be taken by another
        socket before the process binds it (any outgoing connection can get it), so on
        "address already in use" pick new ports and try again."""
        for attempt in range(attempts):
            try:
                self.start(timeout)
                return
            except RuntimeError as e:
                if "address already in use" not in str(e) or attempt == attempts - 1:
                    raise
                self.pick_ports()

    @property
    def tcp_address(self) -> str:
        """``"127.0.0.1:<port>"``: what txnsq's clients (nsqd) or nsqd (nsqlookupd) dial;
        ``"unix:/path/nsqd.sock"`` for an nsqd on unix sockets."""
        if self.tcp_socket is not None:
            return f"unix:{self.tcp_socket}"
        return f"{LOOPBACK}:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        """``"127.0.0.1:<port>"``, or ``"unix:/path/http.sock"``."""
        if self.http_socket is not None:
            return f"unix:{self.http_socket}"
        return f"{LOOPBACK}:{self.http_port}"

    @property
    def http_url(self) -> str:
        if self.http_socket is not None:
            raise AttributeError(f"{self.name} serves HTTP on unix socket {self.http_socket}")
        return f"http://{self.http_address}"

    def _listen_args(self) -> list[str]:
        """``--tcp-address`` and ``--http-address``: ports of 127.0.0.1, or the sockets."""
        tcp = self.tcp_socket or f"{LOOPBACK}:{self.tcp_port}"
        http = self.http_socket or f"{LOOPBACK}:{self.http_port}"
        return [f"--tcp-address={tcp}", f"--http-address={http}"]

    def http_request(
        self, method: str, target: str, body: bytes | None = None, timeout: float = 5.0
    ) -> bytes:
        """``method target`` (path and query) on the HTTP API, TCP or unix socket."""
        if self.http_socket is not None:
            return unix_http(self.http_socket, method, target, body, timeout)
        if method == "GET":
            return http_get(self.http_url + target, timeout)
        return http_post(self.http_url + target, body or b"", timeout)

    def start(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"{self.name} already running")
        if marked_integration is False:
            # scripts/test selects the runs against the other nsqd versions with the
            # marker: an unmarked test would silently be left out of them.
            raise RuntimeError(
                f"a test that starts {self.name} must be marked integration "
                "(pytestmark = pytest.mark.integration, or @pytest.mark.integration on its "
                "class)"
            )
        log = open(self.log_path, "ab")
        self._log = log
        self.proc = subprocess.Popen(
            [nsq_binary(self.name), *self.args()],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                if self.http_request("GET", "/ping", timeout=1.0).strip() == b"OK":
                    return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not answer /ping:\n{self.log_tail()}")
            time.sleep(0.02)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Send ``sig`` (SIGTERM: clean exit, nsqd saves its queues) and wait for exit."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._log.close()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL: nsqd loses what it held only in memory."""
        self.stop(signal.SIGKILL)

    def restart(self, sig: int = signal.SIGTERM) -> None:
        """Stop with ``sig`` and start again on the same ports and data directory."""
        self.stop(sig)
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"".join(f.readlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            return ""


class NSQLookupd(_Process):
    name = "nsqlookupd"

    def __init__(self, workdir: str, extra_args: list[str] | None = None) -> None:
        super().__init__(workdir)
        self.extra_args = list(extra_args or [])

    def args(self) -> list[str]:
        return [*self._listen_args(), f"--broadcast-address={LOOPBACK}", *self.extra_args]

    def lookup(self, topic: str) -> dict[str, Any]:
        url = f"{self.http_url}/lookup?" + urllib.parse.urlencode({"topic": topic})
        try:
            return dict(json.loads(http_get(url)))
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return {"channels": [], "producers": []}
            raise


class NSQD(_Process):
    name = "nsqd"

    def __init__(
        self,
        workdir: str,
        extra_args: list[str] | None = None,
        lookupds: list[NSQLookupd] | None = None,
        *,
        unix_sockets: bool = False,
    ) -> None:
        super().__init__(workdir)
        if unix_sockets:
            self.tcp_socket = os.path.join(workdir, "nsqd.sock")
            self.http_socket = os.path.join(workdir, "http.sock")
        self.https_port = free_port()
        self.data_path = os.path.join(workdir, "data")
        os.makedirs(self.data_path, exist_ok=True)
        self.extra_args = list(extra_args or [])
        self.lookupds = list(lookupds or [])

    def pick_ports(self) -> None:
        super().pick_ports()
        self.https_port = free_port()

    def args(self) -> list[str]:
        return [
            *self._listen_args(),
            f"--https-address={LOOPBACK}:{self.https_port}",
            f"--broadcast-address={LOOPBACK}",
            f"--data-path={self.data_path}",
            *[f"--lookupd-tcp-address={lookupd.tcp_address}" for lookupd in self.lookupds],
            *self.extra_args,
        ]

    # -- HTTP API helpers (blocking; fine in test bodies, keep them off hot loops) --

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
        import struct

        payload = struct.pack(">l", len(bodies)) + b"".join(
            struct.pack(">l", len(b)) + b for b in bodies
        )
        q = urllib.parse.urlencode({"topic": topic, "binary": "true"})
        self.http_request("POST", f"/mpub?{q}", payload)


class ProcessGroup:
    """Processes started for one test (or one class); :meth:`stop_all` stops them all."""

    def __init__(self) -> None:
        self.workdir = tempfile.mkdtemp(prefix="txnsq-test-")
        self.processes: list[_Process] = []

    def lookupd(self, extra_args: list[str] | None = None) -> NSQLookupd:
        p = NSQLookupd(self._subdir("nsqlookupd"), extra_args)
        self.processes.append(p)
        p.start_on_free_ports()
        return p

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
        p = NSQD(self._subdir("nsqd"), extra_args, lookupds, unix_sockets=unix_sockets)
        self.processes.append(p)
        p.start_on_free_ports()
        return p

    def _subdir(self, name: str) -> str:
        return tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir)

    def stop_all(self) -> None:
        for p in reversed(self.processes):
            try:
                p.stop()
            except Exception:
                pass
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_nsqd(
    testcase: Any,
    extra_args: list[str] | None = None,
    lookupds: list[NSQLookupd] | None = None,
    *,
    unix_sockets: bool = False,
) -> NSQD:
    """Start an nsqd for ``testcase`` (a trial/unittest TestCase) and stop it in cleanup
    (``unix_sockets``: see :meth:`ProcessGroup.nsqd`)."""
    if unix_sockets:
        require_unix_sockets()  # before a temporary directory is made
    group = ProcessGroup()
    testcase.addCleanup(group.stop_all)
    return group.nsqd(extra_args, lookupds, unix_sockets=unix_sockets)


def start_lookupd(testcase: Any, extra_args: list[str] | None = None) -> NSQLookupd:
    """Start an nsqlookupd for ``testcase`` and stop it in cleanup."""
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
