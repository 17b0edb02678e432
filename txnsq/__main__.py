"""``python -m txnsq``: which txnsq is installed, and where to go from there.

``python -m txnsq --version`` prints ``txnsq <version>``; with no argument it prints a
few lines: the version, where the documentation is, and the ``twistd nsq-consumer``
command. It imports neither Twisted nor the rest of txnsq, so it works (and is quick)
wherever the package itself is installed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from txnsq._version import __version__

__all__ = ["DOCUMENTATION", "main", "usage"]

#: Where the documentation lives (setup.cfg's ``Documentation`` project URL; a unit
#: test keeps the two equal).
DOCUMENTATION = "https://txnsq.readthedocs.io/"


def usage() -> str:
    """The text ``python -m txnsq`` prints without arguments: the version, the
    documentation's address and the commands to try next, one per line (ends with a
    newline)."""
    return (
        f"txnsq {__version__}: an NSQ client library for Twisted\n"
        f"documentation: {DOCUMENTATION}\n"
        "consume a topic from the command line: twistd nsq-consumer --help\n"
        "this version alone: python -m txnsq --version\n"
    )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``python -m txnsq`` with ``argv`` (default: ``sys.argv[1:]``), writing to
    ``out`` (default: standard output).

    Returns the exit status, 0. ``--version`` prints ``txnsq <version>`` and
    ``--help`` the options; an unknown argument makes :mod:`argparse` print the
    usage and the error to standard error and raise :class:`SystemExit` with
    status 2.
    """
    stream = sys.stdout if out is None else out
    parser = argparse.ArgumentParser(
        prog="python -m txnsq",
        description="Print which txnsq is installed and where its documentation is.",
    )
    parser.add_argument("--version", action="store_true", help="print 'txnsq <version>' and exit")
    args = parser.parse_args(argv)
    if args.version:
        stream.write(f"txnsq {__version__}\n")
    else:
        stream.write(usage())
    return 0


if __name__ == "__main__":
    sys.exit(main())
