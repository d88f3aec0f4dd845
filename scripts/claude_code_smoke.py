#!/usr/bin/env python3
"""Claude Code (`claude -p`), unchanged, against a tokenrelay cluster: one prompt, streamed.

    scripts/claude_code_smoke.py --model-dir DIR                 # slim: `--tools ""`, 200 tokens
    scripts/claude_code_smoke.py --model-dir DIR --full          # its default prompt and tools
    scripts/claude_code_smoke.py --model-dir DIR --claude PATH   # another `claude` binary

It starts an embedded Redis, one `tokenrelay api` and one `tokenrelay worker` serving
`--model-dir` as model `m`, and a recording proxy in front of the API, then runs Claude
Code's recipe for a local server (TOOLING: no vendor traffic, an isolated config directory,
stdin closed, bounded by `--timeout`) and prints what it sent (path, Anthropic headers, body
fields) and what came back (status, `x-tokenrelay-no-effect`, the stream's events, Claude
Code's answer). It exits non-zero unless every request got a 200 and Claude Code succeeded.

Claude Code is on npm, not in this project's dependencies (about 380 MB):
`npm install --prefix /tmp/agent-clis @anthropic-ai/claude-code@2.1.332`. Its slim prompt is
about 1,800 tokens of Qwen's tokenizer: a 2,048-token model fits it only with Qwen's real
tokenizer (`tokenrelay make-tiny-model --shape qwen2-0.5b --tokenizer qwen DIR`, random
weights, a 32k window); the tiny model's own tokenizer makes it about 4,500 tokens, which
tokenrelay refuses with Anthropic's 400 (and Claude Code shows). `--full` needs a 32k model.
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
DEFAULT_CLAUDE = "/tmp/agent-clis/node_modules/.bin/claude"
#: Claude Code's settings for a local server, from TOOLING.md.
CLAUDE_ENV = {
    "ANTHROPIC_AUTH_TOKEN": "x",
    "ANTHROPIC_MODEL": MODEL,
    "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
    "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL,
    "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
    "CLAUDE_CODE_SUBAGENT_MODEL": MODEL,
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
}


def run_claude(claude: str, base_url: str, full: bool, timeout_s: float) -> tuple[int, str]:
    with tempfile.TemporaryDirectory(prefix="claude-home-") as home:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "CLAUDE_CONFIG_DIR": str(Path(home) / "config"),
            "ANTHROPIC_BASE_URL": base_url,
            **CLAUDE_ENV,
        }
        # Its default `max_tokens` (32,000) is past this server's `MAX_TOKENS_LIMIT` and,
        # with its full prompt, past a 32k window: refused with Anthropic's 400, which
        # Claude Code shows. Its own knob lowers it, for the full run too.
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = "1024" if full else "200"
        command = [claude, "-p"]
        if not full:
            command += ["--tools", ""]
        return run_client([*command, "--", PROMPT], env, home, timeout_s)


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """What a request sent and what came back, without the prompt's text."""
    body = record["body"] or {}
    system = body.get("system")
    return {
        "path": record["path"],
        "headers": {
            k: v
            for k, v in record["headers"].items()
            if k.lower().startswith(("anthropic", "x-app"))
        },
        "fields": sorted(body),
        "max_tokens": body.get("max_tokens"),
        "system_blocks": len(system) if isinstance(system, list) else system is not None,
        "message_roles": [m.get("role") for m in body.get("messages", [])],
        "tools": len(body.get("tools") or []),
        "thinking": body.get("thinking"),
        "output_config": body.get("output_config"),
        "status": record.get("status"),
        "x-tokenrelay-no-effect": record.get("no_effect"),
        "client_left": record.get("client_left", False),
        "events": sse_event_names(record),
        "reply_head": record.get("reply", "")[:600],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model-dir", type=Path, required=True, help="the model to serve")
    parser.add_argument("--claude", default=shutil.which("claude") or DEFAULT_CLAUDE)
    parser.add_argument("--full", action="store_true", help="its default prompt and tools")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for claude -p")
    args = parser.parse_args(argv)
    exchanges, code, output = record_run(
        args.model_dir,
        MODEL,
        lambda base_url: run_claude(args.claude, base_url, args.full, args.timeout),
    )
    for record in exchanges:
        print(json.dumps(summary(record), indent=2, ensure_ascii=False))
    print(f"claude -p exited {code}:\n{output.strip()}")
    answered = bool(exchanges) and all(record.get("status") == 200 for record in exchanges)
    return 0 if code == 0 and answered else 1


if __name__ == "__main__":
    sys.exit(main())
