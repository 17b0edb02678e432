"""nsqd's and nsqlookupd's HTTP APIs with txnsq.http (nsqd HTTP on 4151, nsqlookupd on 4161)."""

from twisted.internet import defer, task

from txnsq.http import LookupdHTTPClient, NSQDHTTPClient


async def main(reactor):
    nsqd = NSQDHTTPClient("127.0.0.1:4151", reactor=reactor)
    lookupd = LookupdHTTPClient("127.0.0.1:4161", reactor=reactor)
    await nsqd.create_topic("orders")
    await nsqd.create_channel("orders", "billing")
    await nsqd.multi_publish("orders", [b"order-1", b"order-2"])
    await nsqd.pause_channel("orders", "billing")  # nothing delivered until unpaused

    billing = (await nsqd.stats("orders")).channel("orders", "billing")
    print("billing: depth", billing.depth, "paused", billing.paused)
    for nsqd_entry in (await lookupd.lookup("orders")).nsqds:
        print("orders is on", nsqd_entry.tcp_address)
    await nsqd.close()
    await lookupd.close()


task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
