"""The `tokenrelay` command: `serve`, `api`, `worker`, `make-tiny-model`.

Heavy imports (uvicorn, torch) happen inside the subcommand that needs them, so
`tokenrelay api` never loads torch and `tokenrelay --help` is instant.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

from shared.settings import DEMO_MODEL_NAME, Settings

REDIS_URL_ENV = "TOKENRELAY_REDIS_URL"
_CHILD_STOP_TIMEOUT_S = 30.0
_CHILD_POLL_S = 0.2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    return int(args.handler(args))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenrelay", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version="tokenrelay 0.1.0")
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
    tiny.add_argument("--shape", default="tiny", choices=("tiny", "qwen2-0.5b"))
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(handler=_make_tiny_model)
    return parser


def _api(args: argparse.Namespace) -> int:
    import uvicorn

    Settings()  # fail fast, with pydantic's message, on invalid settings
    uvicorn.run(
        "api.app:create_app_from_env",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        timeout_graceful_shutdown=30,
    )
    return 0


def _worker(args: argparse.Namespace) -> int:
    from worker.main import run_worker

    return run_worker(Settings(), demo=args.demo)


def _make_tiny_model(args: argparse.Namespace) -> int:
    from worker.tiny_model import build_tiny_model

    started = time.monotonic()
    out = build_tiny_model(args.directory, shape=args.shape, seed=args.seed)
    print(f"wrote a {args.shape} Qwen2 checkpoint to {out} in {time.monotonic() - started:.1f}s")
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Everything on one machine; stops all of it on SIGINT/SIGTERM or if a part dies."""
    from shared.embedded_redis import EmbeddedRedis

    env = dict(os.environ)
    with ExitStack() as stack:
        if REDIS_URL_ENV not in env:
            redis_server = stack.enter_context(EmbeddedRedis())
            env[REDIS_URL_ENV] = redis_server.url
            print(f"tokenrelay serve: embedded Redis at {redis_server.url}", flush=True)
        if args.demo:
            env.setdefault("TOKENRELAY_SERVED_MODEL_NAME", DEMO_MODEL_NAME)
        worker_cmd = [sys.executable, "-m", "shared.cli", "worker", *(["--demo"] * args.demo)]
        api_cmd = [sys.executable, "-m", "shared.cli", "api", "--host", args.host]
        api_cmd += ["--port", str(args.port)]
        children = {
            "worker": subprocess.Popen(worker_cmd, env=env),
            "api": subprocess.Popen(api_cmd, env=env),
        }
        stack.callback(_stop_children, list(children.values()))
        print(f"tokenrelay serve: API on http://{args.host}:{args.port}", flush=True)
        return _wait_for_first_exit(children)
    return 0


def _wait_for_first_exit(children: dict[str, subprocess.Popen[bytes]]) -> int:
    stopping = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    while not stopping:
        for name, child in children.items():
            code = child.poll()
            if code is not None:
                print(f"tokenrelay serve: the {name} exited with {code}", file=sys.stderr)
                return code or 1
        time.sleep(_CHILD_POLL_S)
    return 0


def _stop_children(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _CHILD_STOP_TIMEOUT_S
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


if __name__ == "__main__":
    sys.exit(main())
