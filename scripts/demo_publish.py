"""Publish the demo's sample messages with txnsq's Producer (used by ``scripts/demo``).

    python scripts/demo_publish.py --nsqd 127.0.0.1:4150 --topic demo --count 10 \\
        [--lookupd-http 127.0.0.1:4161]

Publishes half of the messages one by one (``PUB``) and the rest in one ``MPUB``, each
waiting for nsqd's ``OK``. With ``--lookupd-http`` it then waits until that nsqlookupd
lists an nsqd for the topic, so a consumer started next finds it on its first poll.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from twisted.internet import defer, task
from twisted.internet.threads import deferToThread

from txnsq import Producer


def sample_bodies(count: int) -> list[bytes]:
    """The demo's message bodies."""
    return [f"hello from txnsq, message {i} of {count}".encode() for i in range(1, count + 1)]


def wait_for_lookupd(address: str, topic: str, timeout: float) -> list[str]:
    """Block until nsqlookupd at ``address`` lists a producer of ``topic``; return them."""
    url = f"http://{address}/lookup?" + urllib.parse.urlencode({"topic": topic})
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                answer = json.load(response)
            producers = answer.get("producers") or answer.get("data", {}).get("producers")
            if producers:
                return [f"{p['broadcast_address']}:{p['tcp_port']}" for p in producers]
        except (OSError, ValueError, urllib.error.URLError):
            pass  # not up yet, or the topic is not registered yet (404)
        if time.monotonic() > deadline:
            raise SystemExit(f"demo_publish: nsqlookupd did not list topic {topic!r} in time")
        time.sleep(0.1)


async def main(reactor: Any, args: argparse.Namespace) -> None:
    producer = Producer(args.nsqd, reactor=reactor, timeout=10.0)
    producer.startService()
    try:
        ready = producer.when_ready()
        ready.addTimeout(10, reactor)
        await ready
        bodies = sample_bodies(args.count)
        half = len(bodies) // 2
        for body in bodies[:half]:
            await producer.publish(args.topic, body)
            print(f"  published (PUB):  {body.decode()}", flush=True)
        if bodies[half:]:
            await producer.multi_publish(args.topic, bodies[half:])
            for body in bodies[half:]:
                print(f"  published (MPUB): {body.decode()}", flush=True)
    finally:
        await producer.stopService()
    if args.lookupd_http:
        producers = await deferToThread(wait_for_lookupd, args.lookupd_http, args.topic, 15.0)
        print(f"  nsqlookupd lists topic {args.topic!r} on nsqd {', '.join(producers)}",
              flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nsqd", required=True, help="nsqd TCP address, host:port")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--lookupd-http", help="nsqlookupd HTTP address to wait for")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, arguments)))
