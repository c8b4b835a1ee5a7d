"""``transformer-mt-serve``: a checkpoint behind HTTP (uvicorn), with the attention page at ``/``.

``transformer-mt-serve --ckpt run/checkpoints/last.ckpt [--engine ctranslate2 --compute-type
int8] [--host 127.0.0.1] [--port 8000]``

The socket is bound before the model loads, so a port in use is one ``error:`` line (exit 2)
and not a traceback after a long start-up; ``--port 0`` takes a free port. The line
``serving on http://HOST:PORT`` on stderr says where the service answers once it does.

Every number is checked as it is parsed (NaN, infinities and values out of range are one
``error:`` line), and an address other than loopback needs an API key
(``TRANSFORMER_MT_API_KEY`` or ``--api-key``) unless ``--insecure`` says to serve it openly.
"""

from __future__ import annotations

import os

# isort: off
# First, before anything imports torch: OpenMP reads how its threads wait only when torch loads.
import transformer_mt.cli.openmp  # noqa: F401  (sets the short spin)
import transformer_mt.cli.onednn  # noqa: F401  (sizes oneDNN's kernel cache)

# isort: on

import argparse
import ipaddress
import logging
import math
import socket
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from transformer_mt.cli.options import (
    add_compile_argument,
    add_engine_arguments,
    check_engine_flags,
    converter,
    user_error,
)
from transformer_mt.errors import EXIT_USER_ERROR
from transformer_mt.serve.limits import RANGES, Limits

log = logging.getLogger(__name__)

#: The environment variable that holds the API key (kept out of ``ps``, unlike ``--api-key``).
KEY_VARIABLE = "TRANSFORMER_MT_API_KEY"


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one ``error:`` line (not the usage and a second line)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}; see {self.prog} --help", file=sys.stderr)
        raise SystemExit(2)


def finite_float(low: float, high: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``low..high`` (NaN and infinities refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"got {text!r}, want a number in {low:g}..{high:g}")
        return value

    return parse


def int_range(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number in ``low..high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"got {text!r}, want a whole number in {low}..{high}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="transformer-mt-serve",
        description=(
            "Serve a transformer-mt checkpoint over HTTP: POST /translate, POST /attention, "
            "GET /model, GET /health, OpenAPI docs at /docs, and a page at / that shows every "
            "attention head. Concurrent requests are batched together."
        ),
        epilog="example: transformer-mt-serve --ckpt run/checkpoints/last.ckpt --port 8000",
    )
    parser.add_argument(
        "--ckpt",
        required=True,
        action="append",
        help="checkpoint (.ckpt) written by train.py; repeat it for an ensemble (torch engine)",
    )
    add_engine_arguments(parser)
    add_compile_argument(parser)
    parser.add_argument(
        "--tgt-lang",
        help="the language a multilingual checkpoint translates into, for every request",
    )
    _add_engine_processes(parser)
    _add_access_arguments(parser)
    defaults = Limits()
    for name, text in (
        ("max_sentences", "sentences per request"),
        ("max_chars", "characters per request"),
        ("max_beam", "largest beam size a request may ask for"),
        ("timeout_s", "seconds a request may wait for its answer"),
        ("max_pending", "sentences waiting before requests get 503"),
        ("batch_tokens", "source tokens per batch"),
        ("window_ms", "most milliseconds a batch waits for the requests it expects"),
        ("max_attention_values", "attention weights one /attention answer may hold"),
    ):
        default, (low, high) = getattr(defaults, name), RANGES[name]
        whole = isinstance(default, int)
        kind = int_range(int(low), int(high)) if whole else finite_float(low, high)
        flag = "--" + name.replace("_", "-")
        parser.add_argument(
            flag, type=kind, default=default, help=f"{text}, {low:g}..{high:g} (default {default})"
        )
    return parser


def _add_engine_processes(parser: argparse.ArgumentParser) -> None:
    """How many engine calls run at once, on how many threads and processes."""
    parser.add_argument(
        "--threads",
        type=int_range(0, 1024),
        default=0,
        help="engine threads of large batches (0 = the cores; small batches, and CTranslate2 "
        "unless set, run on one)",
    )
    parser.add_argument(
        "--lanes",
        type=int_range(0, 1024),
        default=0,
        help="engine calls that may run at once, each on its own thread and its share of "
        "--threads (0 = 1: one call at a time, a large one on every thread)",
    )
    parser.add_argument(
        "--workers",
        type=int_range(0, 256),
        default=0,
        help="engine worker processes, each with the model, one call at a time and its share "
        "of --threads (0 = none: the service's own process translates); use instead of --lanes",
    )


def _add_access_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the service listens, and who may call it."""
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine)"
    )
    parser.add_argument(
        "--port", type=int_range(0, 65535), default=8000, help="port (0 = any free port)"
    )
    parser.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' on every route but the page, its files, the "
        f"docs and /health (default: ${KEY_VARIABLE}; the variable keeps the key out of ps)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="serve an address other than loopback without an API key (anyone who reaches it "
        "may use the model)",
    )


def limits_from(args: argparse.Namespace) -> Limits:
    """The :class:`Limits` of the command line (each flag was checked as it was parsed)."""
    return Limits(**{name: getattr(args, name) for name in RANGES})


def api_key(args: argparse.Namespace) -> str | None:
    """The key of ``--api-key``, else of ``$TRANSFORMER_MT_API_KEY`` (empty: none); a
    ``ValueError`` for one an HTTP header cannot carry."""
    key = args.api_key if args.api_key is not None else os.environ.get(KEY_VARIABLE, "")
    if key and not (key.isascii() and key.isprintable() and " " not in key):
        raise ValueError(
            "the API key holds a space or a character that is not printable ASCII; use e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return key or None


def is_loopback(address: str) -> bool:
    """``address`` (as a socket reports it) is 127.0.0.0/8 or ::1: only this machine."""
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def check_exposure(sock: socket.socket, host: str, key: str | None, insecure: bool) -> None:
    """Refuse (a ``ValueError``) to serve beyond this machine without a key, unless
    ``--insecure``; then say so once on stderr."""
    address, port = sock.getsockname()[:2]
    if key or is_loopback(address):
        return
    if not insecure:
        raise ValueError(
            f"--host {host} serves every machine that can reach {address}:{port}, and no API "
            f"key is set; set {KEY_VARIABLE} (or --api-key), bind --host 127.0.0.1, or add "
            "--insecure to serve without a key"
        )
    print(
        f"warning: serving {address}:{port} without an API key (--insecure): anyone who can "
        "reach it may use the model",
        file=sys.stderr,
    )


def listen(args: argparse.Namespace, key: str | None) -> socket.socket:
    """The socket of ``--host``/``--port``, once :func:`check_exposure` allows it."""
    sock = bind(args.host, args.port)
    try:
        check_exposure(sock, args.host, key, args.insecure)
    except ValueError:
        sock.close()
        raise
    return sock


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; an ``OSError`` with the fix when that fails."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as err:
        raise OSError(
            f"cannot listen on {host}:{port} ({err.strerror or err}); pick another --port "
            "(0 = any free port) or stop what uses it"
        ) from None
    sock.listen(128)
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (2: a user error, one line)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # a mistake (its line is printed), or --help
        return stop.code if isinstance(stop.code, int) else EXIT_USER_ERROR
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    try:
        import uvicorn

        from transformer_mt.serve.app import create_app
        from transformer_mt.serve.model import ServedModel
    except ImportError as err:
        print(
            f"error: {err}; install the serve extra: pip install 'transformer-mt[serve]'",
            file=sys.stderr,
        )
        return EXIT_USER_ERROR
    try:
        check_engine_flags(args)
        limits, key = limits_from(args), api_key(args)
        sock = listen(args, key)
    except (ValueError, OSError) as err:
        return user_error(err)
    with sock:
        try:
            model = ServedModel.open(
                args.ckpt, engine=args.engine, ct2_model=args.ct2_model,
                compute_type=args.compute_type, threads=args.threads, lanes=args.lanes,
                tgt_lang=args.tgt_lang, workers=args.workers, compile=args.compile,
                convert=converter(args.engine, args.ct2_model),
            )  # fmt: skip
        except (ValueError, OSError) as err:
            return user_error(err)
        host, port = sock.getsockname()[:2]
        config = uvicorn.Config(create_app(model, limits, api_key=key), log_level="warning")
        print(f"serving on http://{host}:{port}", file=sys.stderr, flush=True)
        try:
            uvicorn.Server(config).run(sockets=[sock])
        except KeyboardInterrupt:
            return 130
        finally:
            model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
