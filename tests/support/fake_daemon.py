"""A stand-in for the ``nsqd`` and ``nsqlookupd`` programs, in Python: the unit tests of
:mod:`txnsq.testing`'s process helpers run it where no nsq binary is installed.

:func:`fake_bin_dir` writes a directory with an ``nsqd`` and an ``nsqlookupd`` that run
this file. Like the real daemons it listens on ``--http-address`` (a port of 127.0.0.1,
or a unix socket path) and answers ``GET /ping`` with ``OK``, and exits on SIGTERM. It
appends its command line to ``commands`` in its working directory (the process's
directory), one JSON list per run. A ``--fake=MODE`` argument (given in ``args``) makes
it misbehave:

- ``exit``: write ``FATAL: no good`` and exit with status 1 at once;
- ``port-taken-first``: on its first run in the directory, say ``bind: address already
  in use`` (as Go does) and exit with status 1; serve on later runs;
- ``port-taken``: say so on every run;
- ``port-taken-later``: serve on the first run, say the port is taken on later ones;
- ``silent``: never answer ``/ping``;
- ``ignore-term``: ignore SIGTERM (SIGKILL ends it);
- ``chatty``: write 200 numbered lines and exit with status 1.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import socketserver
import stat
import sys
import time
from pathlib import Path

__all__ = ["fake_bin_dir"]


def fake_bin_dir(directory: str | os.PathLike[str]) -> str:
    """Write ``nsqd`` and ``nsqlookupd`` into ``directory`` (made if missing); return its
    absolute path."""
    path = Path(directory).resolve()
    path.mkdir(parents=True, exist_ok=True)
    for name in ("nsqd", "nsqlookupd"):
        program = path / name
        program.write_text(
            f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" {name} "$@"\n',
            encoding="utf-8",
        )
        program.chmod(program.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


class _Ping(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"OK" if self.path == "/ping" else b"NOT_FOUND"
        self.send_response(200 if self.path == "/ping" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        print(f"{self.command} {self.path}", flush=True)


class _UnixHTTPServer(socketserver.UnixStreamServer):
    def get_request(self) -> tuple[socket.socket, tuple[str, int]]:
        request, _ = super().get_request()
        return request, ("local", 0)  # what BaseHTTPRequestHandler expects


def _serve(http_address: str) -> None:
    server: socketserver.BaseServer
    if http_address.startswith("/"):
        server = _UnixHTTPServer(http_address, _Ping)
    else:
        host, _, port = http_address.rpartition(":")
        server = http.server.HTTPServer((host, int(port)), _Ping)
    print(f"HTTP: listening on {http_address}", flush=True)
    server.serve_forever()


def _option(argv: list[str], name: str) -> str | None:
    for arg in argv:
        if arg.startswith(f"--{name}="):
            return arg.partition("=")[2]
    return None


def main(argv: list[str]) -> int:
    program, args = argv[0], argv[1:]
    with open("commands", "a", encoding="utf-8") as f:
        f.write(json.dumps([program, *args]) + "\n")
    runs = len(Path("commands").read_text(encoding="utf-8").splitlines())
    mode = _option(args, "fake") or ""
    http_address = _option(args, "http-address") or ""
    taken = f"FATAL: listen tcp {http_address}: bind: address already in use"
    print(f"{program} (fake) starting", flush=True)
    if mode == "exit":
        print("FATAL: no good", flush=True)
        return 1
    if mode == "chatty":
        for n in range(200):
            print(f"line {n}", flush=True)
        return 1
    if (
        mode == "port-taken"
        or (mode == "port-taken-first" and runs == 1)
        or (mode == "port-taken-later" and runs > 1)
    ):
        print(taken, flush=True)
        return 1
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if mode == "silent":
        while True:
            time.sleep(3600)
    _serve(http_address)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
