"""``transformer-mt-serve``: a checkpoint behind HTTP (uvicorn), with the attention page at ``/``.

``transformer-mt-serve --ckpt run/checkpoints/last.ckpt [--engine ctranslate2 --compute-type
int8] [--host 127.0.0.1] [--port 8000]``

The socket is bound before the model loads, so a port in use is one ``error:`` line (exit 2)
and not a traceback after a long start-up; ``--port 0`` takes a free port. The line
``serving on http://HOST:PORT`` on stderr says where the service answers once it does.
"""

from __future__ import annotations

import os

# As in cli/hydra_app.py: OpenMP reads its wait policy when torch loads, so it is set before
# anything imports torch. PASSIVE threads sleep between parallel regions instead of spinning,
# which on a busy CPU leaves the core to the descheduled sibling; the environment's value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import logging
import socket
import sys
from collections.abc import Sequence

from transformer_mt.cli.options import (
    add_engine_arguments,
    check_engine_flags,
    converter,
    user_error,
)
from transformer_mt.errors import EXIT_USER_ERROR
from transformer_mt.serve.limits import Limits

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    parser.add_argument("--threads", type=int, default=0, help="engine threads (0 = default)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port (0 = any free port)")
    defaults = Limits()
    for name, kind, text in (
        ("max_sentences", int, "sentences per request"),
        ("max_chars", int, "characters per request"),
        ("max_beam", int, "largest beam size a request may ask for"),
        ("timeout_s", float, "seconds a request may wait for its answer"),
        ("max_pending", int, "sentences waiting before requests get 503"),
        ("batch_tokens", int, "source tokens per batch"),
        ("window_ms", float, "milliseconds a batch waits for more requests"),
    ):
        default = getattr(defaults, name)
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=kind, default=default, help=f"{text} (default {default})")
    return parser


def limits_from(args: argparse.Namespace) -> Limits:
    """The :class:`Limits` of the command line; a ``ValueError`` for a flag out of range."""
    values = {name: getattr(args, name) for name in vars(Limits())}
    for name, value in values.items():
        if value < (0 if name == "window_ms" else 1):
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be >= {0 if name == 'window_ms' else 1}, got {value}")
    return Limits(**values)


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
    args = build_parser().parse_args(argv)
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
        limits = limits_from(args)
        sock = bind(args.host, args.port)
    except (ValueError, OSError) as err:
        return user_error(err)
    with sock:
        try:
            model = ServedModel.open(
                args.ckpt, engine=args.engine, ct2_model=args.ct2_model,
                compute_type=args.compute_type, threads=args.threads,
                convert=converter(args.engine, args.ct2_model),
            )  # fmt: skip
        except (ValueError, OSError) as err:
            return user_error(err)
        host, port = sock.getsockname()[:2]
        config = uvicorn.Config(create_app(model, limits), log_level="warning")
        print(f"serving on http://{host}:{port}", file=sys.stderr, flush=True)
        try:
            uvicorn.Server(config).run(sockets=[sock])
        except KeyboardInterrupt:
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
