"""``transformer-mt-serve``: a checkpoint behind HTTP (uvicorn), with the attention page at ``/``.

The socket is bound before the model loads, so a port in use is one ``error:`` line, not a
traceback after a long start-up. An address other than loopback needs an API key unless
``--insecure``.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import math
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields

from transformer_mt.cli.options import (
    OneLineParser,
    add_engine_arguments,
    check_engine_flags,
    converter,
    user_error,
)
from transformer_mt.errors import EXIT_USER_ERROR
from transformer_mt.serve.limits import Limits

#: The environment variable that holds the API key (kept out of ``ps``, unlike ``--api-key``).
KEY_VARIABLE = "TRANSFORMER_MT_API_KEY"


def in_range(low: float, high: float, *, whole: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number (``whole``: a whole one) in ``low..high``."""
    want = f"a whole number in {low:.0f}..{high:.0f}" if whole else f"a number in {low:g}..{high:g}"

    def parse(text: str) -> float:
        try:
            value: float = int(text) if whole else float(text)
        except ValueError:
            value = math.nan
        if not low <= value <= high:  # NaN and infinities too
            raise argparse.ArgumentTypeError(f"got {text!r}, want {want}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    parser.add_argument(
        "--tgt-lang",
        help="the language a multilingual checkpoint translates into, for every request",
    )
    parser.add_argument(
        "--threads",
        type=in_range(0, 1024, whole=True),
        default=0,
        help="engine threads of large batches (0 = the cores; small batches, and CTranslate2 "
        "unless set, run on one)",
    )
    _add_access_arguments(parser)
    for limit in fields(Limits):
        (low, high), default = limit.metadata["range"], limit.default
        kind = in_range(low, high, whole=isinstance(default, int))
        text = f"{limit.metadata['help']}, {low:g}..{high:g} (default {default})"
        flag = "--" + limit.name.replace("_", "-")
        parser.add_argument(flag, type=kind, default=default, help=text)
    return parser


def _add_access_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the service listens, and who may call it."""
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine)"
    )
    parser.add_argument(
        "--port", type=in_range(0, 65535, whole=True), default=8000, help="port (0 = any free port)"
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


def listen(args: argparse.Namespace, key: str | None) -> socket.socket:
    """The socket of ``--host``/``--port``; a ``ValueError`` for an address beyond this
    machine without a key, unless ``--insecure`` (then a warning line on stderr). The address
    is checked when bound, before the port takes any connection."""
    sock = bind(args.host, args.port)
    address, port = sock.getsockname()[:2]
    if key or is_loopback(address):
        sock.listen(128)
        return sock
    if not args.insecure:
        sock.close()
        raise ValueError(
            f"--host {args.host} serves every machine that can reach {address}:{port}, and no "
            f"API key is set; set {KEY_VARIABLE} (or --api-key), bind --host 127.0.0.1, or add "
            "--insecure to serve without a key"
        )
    print(
        f"warning: serving {address}:{port} without an API key (--insecure): anyone who can "
        "reach it may use the model",
        file=sys.stderr,
    )
    sock.listen(128)
    return sock


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, not yet listening; an ``OSError`` with the fix when
    that fails."""
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
        limits = Limits(**{f.name: getattr(args, f.name) for f in fields(Limits)})
        key = api_key(args)
        sock = listen(args, key)
    except (ValueError, OSError) as err:
        return user_error(err)
    with sock:
        try:
            model = ServedModel.open(
                args.ckpt, engine=args.engine, ct2_model=args.ct2_model,
                compute_type=args.compute_type, threads=args.threads, tgt_lang=args.tgt_lang,
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
