"""The txnsq version (read by setup.cfg and sent as the IDENTIFY user agent)."""

__version__ = "0.2.0"
