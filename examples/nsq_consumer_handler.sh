#!/bin/sh
# Hand every message of topic "orders" to handlers.store_order (nsqd on 127.0.0.1:4150).
# Run from the folder that holds handlers.py, so that it can be imported.
PYTHONPATH=. twistd -n --pidfile= nsq-consumer --topic orders --channel store \
    --nsqd-tcp-address 127.0.0.1:4150 --handler handlers:store_order
