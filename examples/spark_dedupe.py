"""Drop redeliveries from an nsq stream in Spark: each message once, by id and nsqd."""

def without_redeliveries(stream):
    """Each NSQ message once, as long as its copies arrive within 10 minutes."""
    return (stream.withWatermark("timestamp", "10 minutes")
        .dropDuplicatesWithinWatermark(["id", "nsqd_address"]))
