"""One ConnectionOptions for a Producer and a Consumer: TLS verified against ca.pem,
and snappy compression (nsqd with its --tls-* options on 127.0.0.1:4150)."""

from twisted.internet import defer, task

from txnsq import ConnectionOptions, Consumer, Producer, TLSOptions

connection = ConnectionOptions(
    tls=TLSOptions(ca_certs="ca.pem", hostname="localhost"),
    compression="snappy",
    # auth_secret="...",  when nsqd has --auth-http-address
)


async def main(reactor):
    producer = Producer("127.0.0.1:4150", options=connection, reactor=reactor)
    producer.startService()
    await producer.publish("audit", b"compressed, over TLS")
    await producer.stopService()

    done = defer.Deferred()

    def handle(message):
        done.callback(message.body)

    consumer = Consumer("audit", "check", handle, nsqd_tcp_addresses=["127.0.0.1:4150"],
                        options=connection, reactor=reactor)
    consumer.startService()
    print("received", (await done).decode())
    await consumer.stopService()


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
