#!/usr/bin/env python3
"""The Codex CLI (`codex exec`), unchanged, against a tokenrelay cluster: one prompt, streamed,
over the Responses API.

    scripts/codex_smoke.py --model-dir DIR                  # slim: fits a 2,048-token model
    scripts/codex_smoke.py --model-dir DIR --full           # its default prompt and tools
    scripts/codex_smoke.py --model-dir DIR --codex PATH     # another `codex` binary

It starts an embedded Redis, one `tokenrelay worker` and one `tokenrelay api` serving
`--model-dir` as model `m`, and a recording proxy in front of the API, then runs the Codex
CLI's recipe for a local server (TOOLING: a custom provider with `wire_api = "responses"`,
an isolated `CODEX_HOME`, no analytics, stdin closed, bounded by `--timeout`) and prints
what it sent (path, headers, body fields, input roles, tools) and what came back (status,
`x-tokenrelay-no-effect`, the stream's events, the CLI's output). It exits non-zero unless
every request got a 200 and `codex exec` succeeded.

The Codex CLI is on npm, not among this project's dependencies (a 424 MB binary):
`npm install --prefix /tmp/agent-clis @openai/codex@0.171.0`. Its slim prompt (one-line
instructions, no skills, agents, goals, image viewer or environment context) is about 800
tokens of Qwen's tokenizer: serve a model with Qwen's real tokenizer
(`tokenrelay make-tiny-model --shape qwen2-0.5b --tokenizer qwen DIR`, random weights) or
the real Qwen2.5 model. `--full` (about 8,700 tokens) needs a 32k model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from tokenrelay.testing.recording_proxy import record_run, run_client, sse_event_names

MODEL = "m"
PROMPT = "Reply with the word hello"
DEFAULT_CODEX = "/tmp/agent-clis/node_modules/.bin/codex"
CONFIG = """\
model = "m"
model_provider = "local"
model_context_window = {window}
approval_policy = "never"
sandbox_mode = "read-only"
web_search = "disabled"
check_for_update_on_startup = false
{slim_top}
[model_providers.local]
name = "tokenrelay"
base_url = "{base_url}/v1"
env_key = "LOCAL_API_KEY"
wire_api = "responses"

[analytics]
enabled = false

[features]
plugins = false
apps = false
{slim_features}
"""
#: TOOLING's settings that bring Codex's prompt under a 2,048-token window.
SLIM_TOP = """\
model_instructions_file = "{instructions}"

[skills]
include_instructions = false

[agents]
enabled = false
"""
SLIM_FEATURES = """\
goals = false
view_image = false
include_environment_context = false
"""


def codex_home(home: Path, base_url: str, full: bool, window: int) -> None:
    (home / "instructions.md").write_text("You are a helpful assistant. Answer briefly.\n")
    slim_top = "" if full else SLIM_TOP.format(instructions=home / "instructions.md")
    config = CONFIG.format(
        window=window,
        base_url=base_url,
        slim_top=slim_top,
        slim_features="" if full else SLIM_FEATURES,
    )
    (home / "config.toml").write_text(config)


def run_codex(
    codex: str, base_url: str, full: bool, window: int, timeout_s: float
) -> tuple[int, str]:
    with tempfile.TemporaryDirectory(prefix="codex-home-") as home:
        codex_home(Path(home), base_url, full, window)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "CODEX_HOME": home,
            "LOCAL_API_KEY": "x",
        }
        command = [codex, "exec", "--ephemeral", "--skip-git-repo-check", PROMPT]
        return run_client(command, env, home, timeout_s)


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """What a request sent and what came back, without the prompt's text."""
    body = record["body"] or {}
    tools = body.get("tools") or []
    return {
        "path": record["path"],
        "headers": sorted(record["headers"]),
        "fields": sorted(body),
        "input": [item.get("role") or item.get("type") for item in body.get("input") or []],
        "tools": [tool.get("type") + ":" + str(tool.get("name")) for tool in tools],
        "tool_choice": body.get("tool_choice"),
        "reasoning": body.get("reasoning"),
        "include": body.get("include"),
        "store": body.get("store"),
        "status": record.get("status"),
        "x-tokenrelay-no-effect": record.get("no_effect"),
        "client_left": record.get("client_left", False),
        "events": sorted(set(sse_event_names(record))),
        "reply_head": record.get("reply", "")[:600],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model-dir", type=Path, required=True, help="the model to serve")
    parser.add_argument("--codex", default=shutil.which("codex") or DEFAULT_CODEX)
    parser.add_argument("--full", action="store_true", help="its default prompt and tools")
    parser.add_argument("--window", type=int, default=2048, help="model_context_window")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for codex exec")
    args = parser.parse_args(argv)
    exchanges, code, output = record_run(
        args.model_dir,
        MODEL,
        lambda base_url: run_codex(args.codex, base_url, args.full, args.window, args.timeout),
    )
    for record in exchanges:
        print(json.dumps(summary(record), indent=2, ensure_ascii=False))
    print(f"codex exec exited {code}:\n{output.strip()}")
    answered = bool(exchanges) and all(record.get("status") == 200 for record in exchanges)
    return 0 if code == 0 and answered else 1


if __name__ == "__main__":
    sys.exit(main())
