"""``nsq``: a PySpark (4.2+) Python data source for NSQ.

Install with the ``spark`` extra (``pip install 'txnsq[spark]'``), then::

    import txnsq.spark
    txnsq.spark.register(spark)  # from any thread: see txnsq.spark.register

    # batch write: one message per row, from a binary or string column "value" (or "body")
    df.write.format("nsq").option("nsqdTcpAddresses", "127.0.0.1:4150") \\
        .option("topic", "events").save()

    # streaming write
    df.writeStream.format("nsq").option("nsqdTcpAddresses", "127.0.0.1:4150") \\
        .option("topic", "events").option("checkpointLocation", "/tmp/ckpt").start()

    # at-least-once streaming read
    spark.readStream.format("nsq").option("topic", "events").option("channel", "spark") \\
        .option("lookupdHttpAddresses", "http://127.0.0.1:4161").load()

Writes
------
Rows carry the message in a ``value`` (or ``body``) column of type binary or string.
Two more columns are understood: ``topic`` (string: the row's topic when option
``topic`` is not set; **the option wins over the column**, as in Kafka's sink) and
``delay_ms`` (an integer: a row with a delay above 0 is published with ``DPUB`` and
delivered that many milliseconds later, one command per row). Any other column (Kafka's
``key``, ``headers``, ...) is an error naming it, unless ``ignoreExtraColumns`` is
``true``. Each task publishes its partition with pipelined MPUBs, framed from the Arrow
column at once, and returns only when nsqd has acknowledged every message. A failed
publish fails the task and Spark retries it: delivery is **at-least-once, and a retried
task publishes again, so consumers can see duplicates**. Published messages cannot be
taken back when a job aborts.

Streaming read
--------------
Rows: ``value`` binary, ``id`` string, ``timestamp`` timestamp (when nsqd received it),
``attempts`` int, ``topic`` string, ``nsqd_address`` string. Messages stay in flight
(TOUCHed) until Spark commits the batch that holds them; only then are they FINished.
When the query stops or fails they are REQueued; when its process dies, nsqd redelivers
them after ``msg_timeout``. So every message is delivered at least once, possibly again
(with ``attempts`` + 1) in a later batch after a failure or restart.

* Batch sizes follow Spark's admission control: ``maxMessagesPerTrigger``,
  ``maxBytesPerTrigger`` (bodies; a batch exceeds it by one message at most) and
  ``minMessagesPerTrigger`` with ``maxTriggerDelay``. ``trigger(availableNow=True)``
  reads what was published before the query started and ends when nothing new arrives
  for ``availableNowIdle`` ("before" compares nsqd's message timestamps with the
  driver's clock; newer messages wait for the next run).
* A batch's rows travel to the executors inside its ``numPartitions`` input partitions
  (Arrow record batches; more partitions when a batch is larger than 64 MiB each).
* The query progress (``query.lastProgress["sources"][0]["latestOffset"]``, a JSON
  string) carries the lag: nsqd's ``depth``, ``inFlight`` and ``deferred`` counts for the
  channel, summed (``"lag"``) and per nsqd (``"nsqd"``), asked over nsqd's HTTP API (at
  most once a second; option ``nsqdHttp`` tells where it is when it is not the TCP port
  + 1 and nsqlookupd does not say).
* ``maxAttempts`` gives up messages delivered more times than that: published to
  ``deadLetterTopic`` on the nsqd they came from and finished once nsqd acknowledged it
  (a failed publish requeues them), or, without a dead-letter topic, finished and logged.
* A message cannot stay in flight longer than nsqd's ``--max-msg-timeout`` (15 min by
  default), TOUCH or not: a batch that takes longer to commit is redelivered (duplicates).
* Messages held for the next batch count against ``maxInFlight``, which defaults to twice
  ``maxMessagesPerTrigger`` (the batch being processed waits for its commit while the
  next one fills). nsqd caps RDY per connection (``--max-rdy-count``, 2500 by default), so
  the reader opens ``ceil(maxInFlight / max_rdy_count)`` connections to each nsqd.
* Messages are held in the driver's Python process: ``maxInFlight`` x message size must
  fit in its memory (100,000 x 100 B by default); lower ``maxMessagesPerTrigger`` (or set
  ``maxBytesPerTrigger``) for large messages.
* Spark may replay the last, uncommitted batch after a restart; that replay is empty
  (its messages were never FINished and come back from nsqd with ``attempts`` + 1).
* A connection on which no frame, not even nsqd's heartbeat, completes within
  ``silenceTimeout`` (two heartbeat intervals plus 0.5 s by default) is presumed dead:
  the reader closes it and connects again; what it held comes back from nsqd after
  ``msgTimeout`` (duplicates, never losses).
* In Docker or Kubernetes, nsqlookupd hands out each nsqd's ``--broadcast-address``,
  often a name only the nsqds' own network resolves: ``addressMap`` maps it to an
  address the reader can reach.

Options (case-insensitive)
--------------------------
The options every txnsq client shares are the camelCase spellings of
:class:`txnsq.options.ConnectionOptions`' fields, with the same meanings and defaults.
Durations are seconds (``"2.5"``) or a number with a unit (``"500ms"``, ``"30s"``, ``"15m"``,
``"1h"``). An unknown option fails the query, naming the nearest valid one.

Both directions::

  ``nsqdTcpAddresses``      ``host:port[,host:port...]`` (required for writes); an nsqd on a
                            unix socket is ``unix:/path`` (nsqd >= 1.3.0)
  ``topic``                 topic name (required for reads; for writes unless a ``topic`` column)
  ``tls``                   ``true`` to use TLS (implied by the other ``tls*`` options)
  ``tlsCaCerts``            PEM bundle of the CAs to trust instead of the system's
  ``tlsClientCert``/``tlsClientKey``  client certificate and key files
  ``tlsHostname``           name nsqd's certificate must carry, if not the address's host
  ``tlsInsecureSkipVerify`` ``true`` accepts any certificate (tests only)
                            (TLS files are read where the options are parsed, on the
                            driver; their contents travel with the job to the executors)
  ``compression``           ``none`` (default), ``snappy`` or ``deflate``; ``deflateLevel``
  ``authSecret``            sent with AUTH when nsqd requires it
  ``clientId``              IDENTIFY client_id (default: the host name)
  ``connectTimeout``        a TCP connect's bound (default 10 s)
  ``handshakeTimeout``      the handshake's bound: IDENTIFY, TLS, AUTH, SUB (default 10 s)
  ``commandTimeout``        a command's wait for nsqd's answer (default 30 s; ``none``:
                            only the silence bound)

Writes::

  ``batchSize``             messages per MPUB (default 500)
  ``maxPendingBatches``     MPUBs in flight per task (default 4)
  ``maxBodySize``           largest MPUB body in bytes (default 1 MiB; at most nsqd's
                            ``--max-body-size``)
  ``ignoreExtraColumns``    ``true``: leave out columns other than value/topic/delay_ms

Reads::

  ``channel``               channel name (required)
  ``lookupdHttpAddresses``  nsqlookupd HTTP address(es) to discover nsqds (``http://host:4161``)
  ``lookupdPollInterval``   time between nsqlookupd polls (default 60 s)...
  ``lookupdPollJitter``     ... each shortened by up to this fraction at random (default 0.3)
  ``lookupdRequestTimeout`` one nsqlookupd request's bound (default 5 s)
  ``maxMessagesPerTrigger`` messages per micro-batch at most (default 50,000)
  ``maxBytesPerTrigger``    bytes of bodies per micro-batch at most (default: no limit)
  ``minMessagesPerTrigger`` wait for this many messages before a batch ...
  ``maxTriggerDelay``       ... but at most this long (``"30s"``, ``"15m"``; default 15m)
  ``numPartitions``         input partitions per micro-batch (default 1)
  ``maxAttempts``           give up a message delivered more times (default 0: never)
  ``deadLetterTopic``       where given-up messages go; ``deadLetterEnvelope`` ``true``
                            publishes a JSON envelope (id, attempts, origin, body)
  ``maxInFlight``           messages held at once (default 2 x maxMessagesPerTrigger)
  ``connectionsPerNsqd``    override the number of connections per nsqd
  ``msgTimeout``            IDENTIFY msg_timeout: redelivery delay if the reader dies
                            (default: nsqd's ``--msg-timeout``)
  ``availableNowIdle``      quiet time that ends a Trigger.AvailableNow run (default 500ms)
  ``heartbeatInterval``     IDENTIFY heartbeat_interval (default 30 s; ``off``: none)
  ``silenceTimeout``        a connection on which no frame completes for this long is
                            replaced (default: two heartbeat intervals plus 0.5 s, or
                            60 s with heartbeats off)
  ``addressMap``            ``announced=reachable[,...]``: dial ``reachable`` for an nsqd
                            nsqlookupd announces as ``announced`` (``host:port``, or a
                            host alone to keep the port), e.g.
                            ``nsqd-0.nsqd:4150=10.0.0.5:4150,nsqd-1=10.0.0.6``
  ``reportLag``             ``false``: no nsqd statistics in the progress (default true)
  ``nsqdHttp``              ``tcp=http`` address pairs (``h:4150=h:4151,...``; the HTTP
                            side may be an ``https://`` URL) for the lag statistics; for
                            sockets ``unix:/a/nsqd.sock=unix:/a/http.sock``

Deprecated spellings (they work, with a DeprecationWarning; removed in 0.4.0)::

  ``nsqd`` (``nsqdTcpAddresses``), ``lookupd`` (``lookupdHttpAddresses``), ``timeout``
  (sets ``connectTimeout``, ``handshakeTimeout`` and ``commandTimeout``),
  ``msgTimeoutMs``, ``heartbeatIntervalMs``, ``availableNowIdleMs`` (in milliseconds;
  ``msgTimeout``, ``heartbeatInterval``, ``availableNowIdle``); since 0.3.0,
  ``readTimeout`` (``silenceTimeout``). Given beside its new name, an old option gives
  way to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txnsq.spark.datasource import NSQDataSource

__all__ = ["NSQDataSource", "register"]


def register(spark: Any) -> Any:
    """Make ``format("nsq")`` usable from the calling thread of ``spark``; return ``spark``.

    Registers :class:`NSQDataSource` on ``spark`` and, for a classic (py4j) session, makes
    ``spark`` the active session of the JVM thread that serves the calling Python thread.
    Call it in every thread that writes or reads with ``format("nsq")`` (a web handler, a
    scheduler's worker): calling it again is cheap and harmless.

    Why: Spark looks a Python data source up in the JVM's *active* session
    (``DataSource.lookupDataSource`` asks ``SparkSession.getActiveSession``, a thread-local),
    and PySpark gives each Python thread its own JVM thread (py4j's pinned threads), which
    starts with no active session. So ``df.write.format("nsq").save()`` from a
    ``threading.Thread`` fails with ``DATA_SOURCE_NOT_FOUND`` even though the source is
    registered on the session, unless that thread set its active session. For a Spark
    Connect session the lookup happens on the server, in the session's own thread: only
    the registration is done.

    :raises ImportError: when pyspark or pyarrow is missing.
    """
    from txnsq.spark.datasource import NSQDataSource

    spark.dataSource.register(NSQDataSource)
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return spark
    # What PySpark's own SparkSession.createDataFrame does for its calling thread.
    session_class = getattr(spark._jvm, "org.apache.spark.sql.classic.SparkSession")
    session_class.setActiveSession(spark._jsparkSession)
    return spark


def __getattr__(name: str) -> Any:
    # Imported lazily, so that the parts that need neither pyspark nor pyarrow
    # (options, the subscriber) import without them.
    if name == "NSQDataSource":
        from txnsq.spark.datasource import NSQDataSource

        return NSQDataSource
    raise AttributeError(f"module 'txnsq.spark' has no attribute {name!r}")
