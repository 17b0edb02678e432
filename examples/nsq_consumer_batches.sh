#!/bin/sh
# Write the clicks of topic "clicks" to clicks.db, up to 500 per transaction (nsqd on
# 127.0.0.1:4150). Run from the folder that holds batch_sqlite.py, so that it can be imported.
PYTHONPATH=. twistd -n --pidfile= nsq-consumer --topic clicks --channel sqlite \
    --nsqd-tcp-address 127.0.0.1:4150 --handler-factory batch_sqlite:make_writer \
    --handler-setting db=clicks.db --max-in-flight 1000 --batch-max-count 500 \
    --batch-linger 0.5
