"""nsqd's HTTP API without a reactor, with txnsq.blocking (nsqd HTTP on 127.0.0.1:4151)."""

from txnsq.blocking import NSQDHTTPClient

nsqd = NSQDHTTPClient("127.0.0.1:4151", timeout=5.0)
nsqd.unpause_channel("orders", "billing")
billing = nsqd.stats("orders", "billing").channel("orders", "billing")
print("billing: depth", billing.depth, "paused", billing.paused)
