"""Publish and consume without a reactor, with the blocking client (nsqd on 127.0.0.1:4150)."""

from txnsq.blocking import Connection

with Connection("127.0.0.1:4150") as conn:
    conn.publish("reports", b"report 1")
    conn.multi_publish("reports", [b"report 2", b"report 3"])

received = []
with Connection("127.0.0.1:4150") as conn:
    conn.subscribe("reports", "printer")
    conn.rdy(10)  # nsqd may send up to 10 messages before we answer
    while len(received) < 3:
        for message in conn.receive(timeout=5.0):
            received.append(message.body)
            conn.finish(message.id)
    conn.close_cleanly()  # CLS: nsqd sends nothing more; then close
print("received", [body.decode() for body in received])
