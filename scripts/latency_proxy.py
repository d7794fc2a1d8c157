#!/usr/bin/env python3
"""A TCP proxy that adds a fixed latency to every request: each burst of bytes from the
client (an HTTP request) is held for --delay-ms before it is forwarded, so every request on
every connection pays the delay once, as a far-away object store would. For benchmarks
(scripts/s3_bench.sh), not tests."""
import argparse
import asyncio


async def pipe(reader, writer, delay):
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            if delay:
                await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", type=int, required=True)
    ap.add_argument("--upstream", required=True, help="host:port")
    ap.add_argument("--delay-ms", type=float, default=20.0)
    a = ap.parse_args()
    host, port = a.upstream.rsplit(":", 1)

    async def handle(cr, cw):
        try:
            sr, sw = await asyncio.open_connection(host, int(port))
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, sw, a.delay_ms / 1000.0), pipe(sr, cw, 0))

    server = await asyncio.start_server(handle, "127.0.0.1", a.listen)
    async with server:
        await server.serve_forever()


asyncio.run(main())
