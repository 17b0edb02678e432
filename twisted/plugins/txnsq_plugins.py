"""The ``twistd nsq-consumer`` plugin: a lazy ServiceMaker and nothing else."""

from twisted.application.service import ServiceMaker

nsqConsumer = ServiceMaker(
    "txnsq consumer",
    "txnsq._twistd",
    "Consume an NSQ topic/channel and hand each message to a handler.",
    "nsq-consumer",
)
