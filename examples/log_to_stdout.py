"""Show txnsq's log lines on stdout (nsqd on 127.0.0.1:4150).

A failed ``publish_nowait`` without ``on_publish_error`` is only logged, and a script
shows no log line until it starts Twisted's logging: do that first.
"""

import sys

from twisted.internet import defer, task
from twisted.logger import (
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    globalLogBeginner,
    textFileLogObserver,
)

from txnsq import Producer

# Everything at info and above; txnsq's own lines from warnings up.
levels = LogLevelFilterPredicate(defaultLogLevel=LogLevel.info)
levels.setLogLevelForNamespace("txnsq", LogLevel.warn)
globalLogBeginner.beginLoggingTo(
    [FilteringLogObserver(textFileLogObserver(sys.stdout), [levels])]
)


async def main(reactor):
    producer = Producer("127.0.0.1:4150", reactor=reactor)
    producer.startService()
    producer.publish_nowait("events", b"x" * 2_000_000)  # over nsqd's --max-msg-size
    await producer.flush()  # the message is reported: here, in a log line
    await producer.stopService()


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
