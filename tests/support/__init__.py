"""Helpers for txnsq's own tests (not part of the installed package)."""
