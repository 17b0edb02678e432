"""txnsq: an NSQ client library for Twisted."""

from txnsq._version import __version__

__all__ = ["__version__"]
