"""`tokenrelay serve` stopped as a terminal stops it: Ctrl-C sends SIGINT to the whole
foreground process group, `serve` and all it started. Its children lead process groups of
their own, so only `serve` hears it, and it drains them in order: a stream that was running
ends with its final event, the exit status is 0, the output has no traceback and no error
line, and no process it started is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import MODEL_NAME
from tokenrelay.cli.embedded_redis import free_port
from tokenrelay.cli.harness import tokenrelay_command
from tokenrelay.testing.polling import eventually

READY_TIMEOUT_S = 180
STOP_TIMEOUT_S = 90
STREAM_TOKENS = 96  # a few seconds on the tiny model: the signal comes while it runs


class Stream(threading.Thread):
    """A streamed chat completion read on a thread: its `data` payloads, and an event set at
    its first content."""

    def __init__(self, base_url: str, tokens: int = STREAM_TOKENS) -> None:
        super().__init__(daemon=True)
        self.base_url = base_url
        self.tokens = tokens
        self.payloads: list[str] = []
        self.first_content = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": self.tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            with (
                httpx.Client(base_url=self.base_url, timeout=60) as http,
                http.stream("POST", "/v1/chat/completions", json=body) as response,
            ):
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.payloads.append(line.removeprefix("data: "))
                        if '"content"' in line:
                            self.first_content.set()
        except BaseException as exc:  # reported by the test
            self.failure = exc


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # zombie


def ready(serve: subprocess.Popen[bytes], log_path: Path) -> bool:
    assert serve.poll() is None, log_path.read_text()
    return any("ready" in line and "tokenrelay.serve" in line for line in _lines(log_path))


def _lines(log_path: Path) -> list[str]:
    return log_path.read_text(errors="replace").splitlines()


def serve_and_stop(
    model_dir: Path, tmp_path: Path, settings: dict[str, str], signum: signal.Signals, tokens: int
) -> tuple[int, float, Stream, set[int], Path]:
    """Start `tokenrelay serve` in a process group of its own, as a shell would, stream a
    reply of `tokens` tokens, and send `signum` to the whole group once the first content
    came; returns serve's exit status, its time to exit, the stream, the processes serve had
    started, and its log."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENRELAY_")}
    env |= {
        "TOKENRELAY_MODEL": str(model_dir),
        "TOKENRELAY_SERVED_MODEL_NAME": MODEL_NAME,
        "TOKENRELAY_CACHE_DIR": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        **settings,
    }
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        serve = subprocess.Popen(
            tokenrelay_command("serve", "--port", str(port)),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # as a shell runs a command: a process group of its own
        )
    children: set[int] = set()
    try:
        eventually(lambda: ready(serve, log_path), READY_TIMEOUT_S, "serve's ready line")
        children = descendants(serve.pid)
        assert len(children) >= 3, children  # Redis, the worker, the API
        stream = Stream(f"http://127.0.0.1:{port}", tokens)
        stream.start()
        assert stream.first_content.wait(60), stream.failure
        signalled = time.monotonic()
        os.killpg(serve.pid, signum)  # the terminal's Ctrl-C: every process of the group
        code = serve.wait(STOP_TIMEOUT_S)
        exit_s = time.monotonic() - signalled
        stream.join(60)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait(30)
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    return code, exit_s, stream, children, log_path


@pytest.mark.parametrize(
    ("signum", "log_format"),
    [
        pytest.param(signal.SIGINT, "text", id="ctrl-c"),
        pytest.param(signal.SIGTERM, "json", id="sigterm-json-logs"),
    ],
)
def test_a_signal_to_the_whole_group_mid_stream_drains_in_order_and_exits_0(
    tiny_model_dir: Path, tmp_path: Path, signum: signal.Signals, log_format: str
) -> None:
    env = {"TOKENRELAY_LOG_FORMAT": log_format}
    code, exit_s, stream, children, log_path = serve_and_stop(
        tiny_model_dir, tmp_path, env, signum, STREAM_TOKENS
    )
    output = _lines(log_path)
    print(f"serve exited {exit_s:.1f} s after {signum.name}")  # the figure, with `-s`
    assert code == 0, "\n".join(output)
    assert [pid for pid in children if alive(pid)] == []

    assert stream.failure is None
    assert stream.payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in stream.payloads[:-1]]
    assert not [chunk for chunk in chunks if "error" in chunk]
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == STREAM_TOKENS

    assert not [line for line in output if "Traceback" in line]
    if log_format == "json":
        records = [json.loads(line) for line in output if line.strip()]
        assert not [record for record in records if record.get("level") == "ERROR"]
        assert {"tokenrelay.serve", "uvicorn.error", "tokenrelay.requests"} <= {
            record.get("logger") for record in records
        }
    else:
        assert not [line for line in output if "ERROR" in line]
    stopped = [line for line in output if "stopped in" in line]
    assert len(stopped) == 1


def test_a_stream_that_outlives_the_apis_drain_ends_with_its_last_word_not_cut(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A reply far longer than the API's drain (`TOKENRELAY_API_DRAIN_S`): a second before
    the drain ends, the stream gets an `api_shutting_down` error and `[DONE]` (its job is
    cancelled), where uvicorn would cut it mid-body and log a traceback."""
    long_reply = 1500
    settings = {"TOKENRELAY_API_DRAIN_S": "2", "TOKENRELAY_LOG_FORMAT": "json"}
    code, exit_s, stream, children, log_path = serve_and_stop(
        tiny_model_dir, tmp_path, settings, signal.SIGINT, long_reply
    )
    output = _lines(log_path)
    assert code == 0, "\n".join(output)
    assert [pid for pid in children if alive(pid)] == []
    assert stream.failure is None
    assert stream.payloads[-1] == "[DONE]"
    last = json.loads(stream.payloads[-2])
    assert last["error"]["code"] == "api_shutting_down"
    assert 1 < len(stream.payloads) - 2 < long_reply  # some tokens, then the last word
    assert not [line for line in output if "Traceback" in line]
    records = [json.loads(line) for line in output if line.strip()]
    assert not [record for record in records if record.get("level") == "ERROR"]
    assert exit_s < 60
