"""pytest tests against a real nsqd and nsqlookupd, with txnsq.testing's pytest plugin.

Run them with ``python -m pytest -p txnsq.testing.pytest real_nsqd_pytest.py`` (or list
``"txnsq.testing.pytest"`` in ``pytest_plugins`` in your top-level ``conftest.py``), with
nsqd and nsqlookupd on ``PATH``, in ``NSQ_BIN_DIR`` or given as ``--nsq-bin-dir``.
"""

import time

from txnsq.blocking import Connection, Subscriber, SubscriberOptions


def test_publish_then_consume(nsqd):
    # nsqd: a running nsqd of this test's own, on free ports of 127.0.0.1.
    with Connection(nsqd.tcp_address) as conn:
        conn.publish("orders", b"order-1")
    nsqd.restart()  # SIGTERM: nsqd writes its queues to disk, and starts again
    with Connection(nsqd.tcp_address) as conn:
        conn.subscribe("orders", "billing")
        conn.rdy(1)
        [message] = conn.receive(timeout=5.0)
        conn.finish(message.id)
    assert message.body == b"order-1"


def test_subscriber_finds_nsqd_through_nsqlookupd(lookupd, start_nsqd):
    # start_nsqd starts as many nsqds as the test asks for, here one that registers
    # with nsqlookupd.
    nsqd = start_nsqd(lookupds=[lookupd])
    with Connection(nsqd.tcp_address) as conn:
        conn.multi_publish("audit", [b"event 1", b"event 2"])
    options = SubscriberOptions(
        topic="audit",
        channel="archive",
        lookupd_http_addresses=[lookupd.http_address],
        lookupd_poll_interval=0.5,  # nsqd registers the topic a moment after it exists
    )
    archived = []
    deadline = time.monotonic() + 10
    with Subscriber(options) as sub:
        while len(archived) < 2 and time.monotonic() < deadline:
            if sub.wait_for_data(1.0):
                chunks = sub.take(10)
                for _, messages in chunks:
                    archived.extend(message.body for message in messages)
                sub.finish(chunks)
    assert sorted(archived) == [b"event 1", b"event 2"]
