"""Count clicks per page and minute in SQLite, writing up to 500 rows per transaction
through twisted.enterprise.adbapi (nsqd on 127.0.0.1:4150).

Run as a script, it publishes 2,000 clicks and one unreadable message, consumes them
with a batch handler and prints the counts. As a module, ``twistd nsq-consumer
--handler-factory batch_sqlite:make_writer`` runs the same writer
(nsq_consumer_batches.sh).
"""

import json
import os
import tempfile
import time

from twisted.application.service import Service
from twisted.enterprise import adbapi
from twisted.internet import defer, task
from twisted.logger import Logger

from txnsq import Consumer, Producer

log = Logger()


def insert(transaction, rows):
    # One statement for the whole batch. A click delivered twice (nsqd redelivers a
    # message whose FIN was lost) has the same message id: it is not counted twice.
    transaction.executemany("INSERT OR IGNORE INTO clicks VALUES (?, ?, ?)", rows)


class ClickWriter(Service):
    """Writes each batch of clicks in one transaction; ``handle_batch`` is the batch
    handler. Its database pool opens before the consumer starts and closes after the
    consumer's last batch."""

    def __init__(self, path):
        self.path = path
        self.pool = None

    def startService(self):
        super().startService()
        # SQLite takes one writer at a time: one connection, batches queue for it.
        self.pool = adbapi.ConnectionPool(
            "sqlite3", self.path, check_same_thread=False, cp_min=1, cp_max=1
        )
        return self.pool.runOperation(
            "CREATE TABLE IF NOT EXISTS clicks (id TEXT PRIMARY KEY, page TEXT, minute INTEGER)"
        )

    def stopService(self):
        super().stopService()
        self.pool.close()

    def handle_batch(self, messages):
        rows = []
        for message in messages:
            try:
                click = json.loads(message.body)
                rows.append((message.id.decode(), click["page"], click["ts"] // 60))
            except (ValueError, KeyError, TypeError):
                log.warn("Dropping unreadable click {body!r}", body=message.body[:100])
                message.finish()  # answered on its own: it is not retried
        # The Deferred answers the others: finished once the transaction commits,
        # requeued (and the consumer backs off) if it fails.
        d = self.pool.runInteraction(insert, rows)
        d.addCallback(lambda _: log.info("Stored {count} clicks", count=len(rows)))
        return d


def make_writer(context):
    """For ``--handler-factory batch_sqlite:make_writer --handler-setting db=PATH``."""
    return ClickWriter(context.settings.get("db", "clicks.db"))


async def main(reactor):
    writer = ClickWriter(os.path.join(tempfile.mkdtemp(), "clicks.db"))
    await writer.startService()

    producer = Producer("127.0.0.1:4150", reactor=reactor)
    producer.startService()
    pages = ["/", "/cart", "/pricing"]
    clicks = [
        json.dumps({"page": pages[n % 3], "ts": 1_700_000_000 + n // 20}).encode()
        for n in range(2000)
    ]
    await producer.multi_publish("clicks", [*clicks, b"not json"])
    await producer.stopService()

    consumer = Consumer(
        "clicks",
        "sqlite",
        batch_handler=writer.handle_batch,
        nsqd_tcp_addresses=["127.0.0.1:4150"],
        batch_max_count=500,  # rows per transaction
        batch_linger=0.5,  # or what came within half a second
        max_in_flight=1000,  # room for a batch to fill while another is written
        reactor=reactor,
    )
    consumer.startService()
    while consumer.stats()["finished"] < 2001:
        await task.deferLater(reactor, 0.1)
    await consumer.stopService()  # waits for the batches being written

    counts = await writer.pool.runQuery(
        "SELECT page, minute, count(*) FROM clicks GROUP BY page, minute ORDER BY page, minute"
    )
    for page, minute, count in counts:
        print(f"{page:<9} {time.strftime('%H:%M', time.gmtime(minute * 60))} UTC {count:>4}")
    writer.stopService()


if __name__ == "__main__":
    task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
