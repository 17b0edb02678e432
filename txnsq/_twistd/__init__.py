"""``twistd nsq-consumer``: what ``twisted/plugins/txnsq_plugins.py`` points twistd at.

``options`` parses the command line and builds the service (:class:`Options`,
:func:`makeService`), ``handlers`` resolves what ``--handler`` and
``--handler-factory`` name, ``service`` runs the consumer with the handler's own
service, the stats line and the ``/metrics`` endpoint.
"""

from txnsq._twistd.options import Options, makeService

__all__ = ["Options", "makeService"]
