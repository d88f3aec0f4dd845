"""Where the engine is built against where it is stepped: torch's OpenMP pools.

libgomp gives every thread that opens a parallel region its own pool of OpenMP threads. An
engine built on one thread (loading the model runs parallel torch ops) and stepped on
another leaves the process with two pools, more OpenMP threads than cores, and libgomp then
spins only ~100 times before sleeping at the end of each parallel region. Each placement runs
in a fresh process (pools live as long as their thread), in interleaved rounds: a lone chat
decodes `--new-tokens` tokens on a second thread, four times; the table shows the median
decode step (min and median over rounds) and the process's voluntary context switches.

    .venv/bin/python -m bench.probes.lone_stream.pools [--dtype bfloat16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
from pathlib import Path

from bench.common import ensure_model, log, make_conversations

PLACEMENTS = {
    "built on the main thread, stepped on another (the worker before)": "apart",
    "built and stepped on one thread (the worker now)": "together",
}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.lone_stream.pools")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--child", choices=sorted(PLACEMENTS.values()), help=argparse.SUPPRESS)
    args = parser.parse_args()
    model_dir = ensure_model(args.cache_dir.resolve(), "qwen2-0.5b")
    if args.child:
        print(json.dumps(_child(str(model_dir), args.dtype, args.child, args.new_tokens)))
        return 0
    results: dict[str, list[dict]] = {}
    loads = []
    for round_index in range(args.rounds):
        for placement in PLACEMENTS.values():
            command = [sys.executable, "-m", "bench.probes.lone_stream.pools", "--child", placement]
            command += ["--dtype", args.dtype, "--new-tokens", str(args.new_tokens)]
            command += ["--cache-dir", str(args.cache_dir)]
            output = subprocess.run(command, capture_output=True, text=True, check=True)
            results.setdefault(placement, []).append(json.loads(output.stdout.splitlines()[-1]))
        loads.append(os.getloadavg()[0])
        log(f"round {round_index + 1}/{args.rounds}, load {loads[-1]:.1f}")
    print(f"qwen2-0.5b, {args.dtype}, load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("| engine | decode step ms min / median | voluntary context switches |")
    print("|---|---|---:|")
    for label, placement in PLACEMENTS.items():
        runs = results[placement]
        steps = [run["decode_ms"] for run in runs]
        switches = statistics.median(run["voluntary_switches"] for run in runs)
        print(f"| {label} | {min(steps):.1f} / {statistics.median(steps):.1f} | {switches:,.0f} |")
    return 0


def _child(model_dir: str, dtype: str, placement: str, new_tokens: int) -> dict:
    from bench.probes.lone_stream.__main__ import _engine, _lone

    prebuilt = _engine(model_dir, dtype) if placement == "apart" else None
    steps: list[float] = []

    def decode() -> None:
        engine = prebuilt or _engine(model_dir, dtype)
        chats = make_conversations(5, 128, "pools", engine.tokenizer)
        _lone(engine, chats[0], 4)  # warm-up
        steps.extend(_lone(engine, chat, new_tokens)[1] for chat in chats[1:])

    thread = threading.Thread(target=decode)
    thread.start()
    thread.join()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "decode_ms": statistics.median(steps) * 1e3,
        "voluntary_switches": usage.ru_nvcsw,
    }


if __name__ == "__main__":
    raise SystemExit(main())
