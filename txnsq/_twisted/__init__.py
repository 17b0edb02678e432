"""Twisted plumbing that :class:`~txnsq.Producer` and :class:`~txnsq.Consumer` share: what
they dial for an nsqd (``endpoints``), the ``ClientService`` that keeps one nsqd
connected (``service``), what they do with an address that is the wrong port
(``wrongport``) and the OpenTelemetry pieces of their traced paths (``tracing``)."""
