"""The figures of one `bench.gateway` level and the markdown tables they print as.

`figures()` turns a `LevelResult` into flat numbers once; the tables and the `--json` dump
both read those, so what is printed and what is saved never disagree.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from bench.gateway.client import LoadStats
from bench.gateway.cluster import Delta

PHASES = ("to_admitted", "to_started", "to_first_token")
Figures = dict[str, float | int | str | list[int] | dict[str, float]]


@dataclass(frozen=True)
class LevelPlan:
    streams: int
    tokens_per_s: float
    stream_s: float
    duration_s: float

    @property
    def max_tokens(self) -> int:
        return max(2, round(self.stream_s * self.tokens_per_s))


@dataclass
class LevelResult:
    mode: str
    plan: LevelPlan
    flush_ms: float
    first_token_ms: float
    load_1m: float
    stats: LoadStats
    delta: Delta
    api_cpu_s: list[float]
    worker_cpu_s: list[float]
    client_cpu_s: float
    conns_per_api: list[int]
    conns_per_worker: list[int]
    conns_total_max: int
    pubsub_omem_max: int
    phases_ms: dict[str, list[float]] = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def figures(r: LevelResult) -> Figures:
    wall_s = r.delta.wall_s
    tokens = sum(r.stats.tokens_by_api)
    per_token = max(1, tokens)
    ttft_ms = [1000 * t - r.first_token_ms for t in r.stats.ttft_s]
    itl_ms = [1000 * t for t in r.stats.itl_added_s]
    api_tokens = [max(1, n) for n in r.stats.tokens_by_api]
    workers = max(1, len(r.worker_cpu_s))
    out: Figures = {
        "mode": r.mode,
        "tokens_per_s_per_stream": r.plan.tokens_per_s,
        "flush_ms": r.flush_ms,
        "streams": r.plan.streams,
        "stream_tokens": r.plan.max_tokens,
        "load_1m": r.load_1m,
        "window_s": wall_s,
        "ttft_samples": len(ttft_ms),
        "ttft_added_p50_ms": percentile(ttft_ms, 50),
        "ttft_added_p99_ms": percentile(ttft_ms, 99),
        "itl_added_p50_ms": percentile(itl_ms, 50),
        "itl_added_p99_ms": percentile(itl_ms, 99),
        "itl_added_max_ms": max(itl_ms, default=float("nan")),
        "chunk_gap_p50_ms": percentile([1000 * t for t in r.stats.chunk_gap_s], 50),
        "chunk_gap_p99_ms": percentile([1000 * t for t in r.stats.chunk_gap_s], 99),
        "tokens_per_chunk": sum(r.stats.chunk_tokens) / max(1, len(r.stats.chunk_tokens)),
        "tokens": tokens,
        "tokens_per_s_per_api": tokens / wall_s / len(api_tokens),
        "api_cpu_pct": 100 * sum(r.api_cpu_s) / wall_s / len(r.api_cpu_s),
        "api_cpu_us_per_token": 1e6 * sum(r.api_cpu_s) / sum(api_tokens),
        "worker_cpu_pct": 100 * sum(r.worker_cpu_s) / wall_s / workers,
        "worker_cpu_us_per_token": 1e6 * sum(r.worker_cpu_s) / per_token,
        "client_cpu_pct": 100 * r.client_cpu_s / wall_s,
        "redis_cmds_per_token": r.delta.commands.total() / per_token,
        "redis_cpu_pct": 100 * r.delta.redis_cpu_s / wall_s,
        "redis_cpu_us_per_token": 1e6 * r.delta.redis_cpu_s / per_token,
        "redis_in_bytes_per_token": r.delta.net_in_bytes / per_token,
        "redis_out_bytes_per_token": r.delta.net_out_bytes / per_token,
        "redis_conns_per_api": r.conns_per_api,
        "redis_conns_per_worker": r.conns_per_worker,
        "redis_clients_max": r.conns_total_max,
        "pubsub_omem_max_bytes": r.pubsub_omem_max,
        "streams_started": r.stats.streams_started,
        "errors": sum(r.stats.errors.values()),
        "calls_per_token": {
            name: calls / per_token for name, calls in r.delta.commands.most_common()
        },
        "usec_per_token": {
            name: usec / per_token for name, usec in r.delta.command_usec.most_common()
        },
    }
    for name in PHASES:
        out[f"{name}_p50_ms"] = percentile(r.phases_ms.get(name, []), 50)
        out[f"{name}_p99_ms"] = percentile(r.phases_ms.get(name, []), 99)
    return out


def _spread(values: object) -> str:
    assert isinstance(values, list)
    if not values:
        return "-"
    return str(values[0]) if len(set(values)) == 1 else "/".join(map(str, values))


def _pair(f: Figures, low: str, high: str) -> str:
    a, b = f[low], f[high]
    assert isinstance(a, float) and isinstance(b, float)
    return "-" if math.isnan(a) else f"{a:.1f} / {b:.1f}"


def _head(f: Figures) -> str:
    mode = "" if f["mode"] == "chat" else f" ({f['mode']})"
    return f"| {f['tokens_per_s_per_stream']:g} | {f['flush_ms']:g} | {f['streams']}{mode} "


def api_table(rows: list[Figures]) -> str:
    """Each API's added TTFT and API CPU per token against chat completions' at the same
    level of the same run."""
    lines = [
        "| tok/s per stream | flush ms | streams | TTFT added p50 ms | vs chat "
        "| API CPU µs/token | vs chat |",
        "|" + "---|" * 7,
    ]
    chat = {_level(f): f for f in rows if f["mode"] == "chat"}
    for f in rows:
        base = chat.get(_level(f))
        if base is None or f is base:
            continue
        ttft, base_ttft = f["ttft_added_p50_ms"], base["ttft_added_p50_ms"]
        cpu, base_cpu = f["api_cpu_us_per_token"], base["api_cpu_us_per_token"]
        assert isinstance(ttft, float) and isinstance(base_ttft, float)
        assert isinstance(cpu, float) and isinstance(base_cpu, float)
        lines.append(
            _head(f) + f"| {ttft:.2f} | {ttft - base_ttft:+.2f} ms "
            f"| {cpu:.1f} | {100 * (cpu / base_cpu - 1):+.1f} % |"
        )
    return "\n".join(lines)


def _level(f: Figures) -> tuple[object, ...]:
    return (f["tokens_per_s_per_stream"], f["flush_ms"], f["streams"])


def main_table(rows: list[Figures]) -> str:
    lines = [
        "| tok/s per stream | flush ms | streams | load 1m | TTFT added p50 / p99 ms (n) "
        "| ITL added p50 / p99 ms | tok/s per API | API CPU % (µs/token) | worker CPU % "
        "| client CPU % | Redis cmds/token | Redis CPU % (µs/token) | Redis conns per API "
        "| per worker | errors |",
        "|" + "---|" * 15,
    ]
    for f in rows:
        lines.append(
            _head(f) + f"| {f['load_1m']:.1f} "
            f"| {_pair(f, 'ttft_added_p50_ms', 'ttft_added_p99_ms')} ({f['ttft_samples']}) "
            f"| {f['itl_added_p50_ms']:.1f} / {f['itl_added_p99_ms']:.1f} "
            f"| {f['tokens_per_s_per_api']:,.0f} "
            f"| {f['api_cpu_pct']:.0f} ({f['api_cpu_us_per_token']:.0f}) "
            f"| {f['worker_cpu_pct']:.0f} | {f['client_cpu_pct']:.0f} "
            f"| {f['redis_cmds_per_token']:.2f} "
            f"| {f['redis_cpu_pct']:.0f} ({f['redis_cpu_us_per_token']:.1f}) "
            f"| {_spread(f['redis_conns_per_api'])} | {_spread(f['redis_conns_per_worker'])} "
            f"| {f['errors']} |"
        )
    return "\n".join(lines)


def phase_table(rows: list[Figures]) -> str:
    lines = [
        "| tok/s per stream | flush ms | streams | send → admitted p50 / p99 ms "
        "| admitted → worker started | worker started → first token at client |",
        "|" + "---|" * 6,
    ]
    for f in rows:
        cells = [_pair(f, f"{name}_p50_ms", f"{name}_p99_ms") for name in PHASES]
        lines.append(_head(f) + "| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _by_command(f: Figures, field: str, top: int, digits: int) -> str:
    """The `top` commands of a per-command figure, largest first: "xadd 1.08, …"."""
    values = f[field]
    assert isinstance(values, dict)
    return ", ".join(f"{name} {n:.{digits}f}" for name, n in list(values.items())[:top])


def redis_table(rows: list[Figures], top: int = 12) -> str:
    lines = [
        "| tok/s per stream | flush ms | streams | Redis calls per token, by command "
        "| bytes in / out per token | Redis clients (max) | pub/sub omem max "
        "| a reader's gap between chunks p50 / p99 ms (tokens per chunk) |",
        "|" + "---|" * 8,
    ]
    for f in rows:
        lines.append(
            _head(f) + f"| {_by_command(f, 'calls_per_token', top, 2)} "
            f"| {f['redis_in_bytes_per_token']:.0f} / {f['redis_out_bytes_per_token']:.0f} "
            f"| {f['redis_clients_max']} | {f['pubsub_omem_max_bytes']:,} "
            f"| {_pair(f, 'chunk_gap_p50_ms', 'chunk_gap_p99_ms')} "
            f"({f['tokens_per_chunk']:.1f}) |"
        )
    return "\n".join(lines)


def redis_time_table(rows: list[Figures], top: int = 10) -> str:
    """Where Redis's CPU per token goes: time inside commands (a script's time includes the
    commands it calls, which appear again under their own names) against the whole."""
    lines = [
        "| tok/s per stream | flush ms | streams | Redis CPU µs per token "
        "| inside commands, by command (µs per token) |",
        "|" + "---|" * 5,
    ]
    for f in rows:
        parts = _by_command(f, "usec_per_token", top, 1)
        lines.append(_head(f) + f"| {f['redis_cpu_us_per_token']:.1f} | {parts} |")
    return "\n".join(lines)


def write_json(path: Path, header: dict[str, object], rows: list[Figures]) -> None:
    path.write_text(json.dumps({**header, "levels": rows}, indent=2) + "\n")
