#!/bin/sh
# Tail a topic through nsqlookupd with the twistd plugin (nsqlookupd on 127.0.0.1:4161).
twistd -n --pidfile= nsq-consumer --topic events --channel tail \
    --lookupd-http-address 127.0.0.1:4161 --max-in-flight 10
