"""A handler module for ``twistd nsq-consumer --handler handlers:store_order``."""

import json


def store_order(message):
    """Handle one order: returning True finishes the message (an exception requeues it)."""
    order = json.loads(message.body)
    print("stored order", order["id"], flush=True)
    return True
