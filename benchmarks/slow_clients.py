"""Connections that trickle a request's headers a byte a second (benchmarks/webhook_load.py).

    python benchmarks/slow_clients.py --port P --count 200

Prints "connected" once all are open; on SIGTERM, prints how many the server closed meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl

REQUEST = (b"POST /validate?timeout=10s HTTP/1.1\r\nHost: image-preflight.image-preflight.svc\r\n"
           + b"X-Slow: " + b"a" * 4096)


async def trickle(port: int, context: ssl.SSLContext, closed: list[int]) -> None:
    while True:  # reconnect when the server cuts us off, as a persistent attacker would
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                      server_hostname="image-preflight.image-preflight.svc")
            for byte in REQUEST:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1.0)
        except (OSError, ssl.SSLError, ConnectionError):
            closed[0] += 1
            await asyncio.sleep(0.1)


async def main(port: int, count: int) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    closed = [0]
    tasks = [asyncio.create_task(trickle(port, context, closed)) for _ in range(count)]
    await asyncio.sleep(1.0)
    print("connected", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for task in tasks:
        task.cancel()
    print(f"{count} slow clients; the server closed {closed[0]} of their connections", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.port, args.count))
