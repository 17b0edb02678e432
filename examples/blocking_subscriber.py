"""Consume with the blocking Subscriber, without a reactor (nsqd on 127.0.0.1:4150).

A Subscriber reads from every nsqd given (``nsqd_tcp_addresses``) or found through
nsqlookupd (``lookupd_http_addresses``), sharing ``max_in_flight`` between them.
"""

from txnsq.blocking import Connection, Subscriber, SubscriberOptions

with Connection("127.0.0.1:4150") as conn:
    conn.multi_publish("audit", [b"event %d" % n for n in range(5)])

options = SubscriberOptions(
    topic="audit",
    channel="archive",
    nsqd_tcp_addresses=["127.0.0.1:4150"],
    max_in_flight=100,
)
archived = []
with Subscriber(options) as sub:  # starts it; closes it at the end (requeues the rest)
    while len(archived) < 5:
        if sub.wait_for_data(1.0):
            chunks = sub.take(100)  # [(connection, [message, ...]), ...]
            for _, messages in chunks:
                archived.extend(message.body for message in messages)
            sub.finish(chunks)  # FIN them all
print("archived", len(archived), "events")
