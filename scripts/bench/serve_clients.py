"""The service benchmark's clients, in a process of their own: what a user's clients see.

``python scripts/bench/serve_clients.py URL LINES_JSON MODE ...`` prints one JSON object:

* ``load CLIENTS SECONDS BEAM``: ``CLIENTS`` clients, each posting one sentence per request
  back to back over its own kept-alive connection for ``SECONDS``: the latencies, errors and
  elapsed time;
* ``single REQUESTS BEAM``: one client, one sentence at a time: the latencies and each answer's
  ``Server-Timing`` stages (milliseconds, :mod:`transformer_mt.serve.timing`).

The clients speak HTTP/1.1 over asyncio streams, a few lines per request, as load generators
such as wrk do: a client library's own work per request (httpx's is a good share of a
millisecond) would be measured as the server's on a 2-core machine. The answers are parsed as
JSON and checked: one translation per request.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any
from urllib.parse import urlsplit


class Connection:
    """One kept-alive HTTP/1.1 connection that posts JSON and reads the answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, url: str) -> Connection:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        return cls(reader, writer, parts.netloc)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        """The status, headers (lower-case names) and body of the answer to one POST."""
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode() + data)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = raw.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        content = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return int(status_line.split()[1]), headers, content

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def _check(status: int, content: bytes) -> str | None:
    """Why an answer is not one translation (None: it is)."""
    if status != 200:
        return f"{status}: {content[:200].decode(errors='replace')}"
    if len(json.loads(content)["translations"]) != 1:
        return "not one translation"
    return None


async def load(url: str, lines: list[str], clients: int, seconds: float, beam: int) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    counter = iter(range(10**9))
    connections = [await Connection.open(url) for _ in range(clients)]
    end = time.perf_counter() + seconds

    async def one_client(conn: Connection) -> None:
        while time.perf_counter() < end:
            line = lines[next(counter) % len(lines)]
            start = time.perf_counter()
            try:
                status, _, content = await conn.post(
                    "/translate", {"text": [line], "beam_size": beam}
                )
            except (OSError, asyncio.IncompleteReadError) as err:
                errors.append(repr(err))
                return
            problem = _check(status, content)
            if problem is not None:
                errors.append(problem)
                continue
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(one_client(c) for c in connections))
    elapsed = time.perf_counter() - start
    for conn in connections:
        await conn.close()
    return {"latencies": latencies, "errors": errors, "seconds": elapsed}


def parse(value: str) -> dict[str, float]:
    """A ``Server-Timing`` value as {name: milliseconds} (entries without ``dur`` left out)."""
    out = {}
    for entry in value.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        for param in params:
            key, _, number = param.partition("=")
            if key.strip() == "dur":
                out[name] = float(number)
    return out


async def single(url: str, lines: list[str], requests: int, beam: int) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    stages: list[dict[str, float]] = []
    conn = await Connection.open(url)
    start_all = time.perf_counter()
    for i in range(requests):
        body = {"text": [lines[i % len(lines)]], "beam_size": beam}
        start = time.perf_counter()
        status, headers, content = await conn.post("/translate", body)
        latency = time.perf_counter() - start
        problem = _check(status, content)
        if problem is not None:
            errors.append(problem)
            continue
        latencies.append(latency)
        stages.append(parse(headers.get("server-timing", "")))
    elapsed = time.perf_counter() - start_all
    await conn.close()
    return {"latencies": latencies, "errors": errors, "seconds": elapsed, "stages": stages}


def main(argv: list[str]) -> None:
    url, lines_json, mode, *rest = argv
    with open(lines_json, encoding="utf-8") as f:
        lines = json.load(f)
    if mode == "load":
        clients, seconds, beam = int(rest[0]), float(rest[1]), int(rest[2])
        result = asyncio.run(load(url, lines, clients, seconds, beam))
    elif mode == "single":
        result = asyncio.run(single(url, lines, int(rest[0]), int(rest[1])))
    else:
        raise SystemExit(f"error: unknown mode {mode!r}; use load or single")
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
