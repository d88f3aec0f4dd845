"""One row's figures from its requests, the table of every row, and the issue's targets."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from bench.prefix.cluster import Variant
from bench.prefix.traffic import Request, RowTraffic

#: The targets of issue 35, item 5, on 2 workers.
FOLLOW_UP_P90_VS_COLD_P50 = 0.4
HIT_RATE_VS_ONE_WORKER = 0.9
MAX_LOAD_VS_MEAN = 1.5
DISTINCT_THROUGHPUT_VS_BASELINE = 0.95


@dataclass(frozen=True)
class Row:
    variant: Variant
    baseline: bool
    cold_p50_s: float
    cold_p90_s: float
    follow_up_p50_s: float
    follow_up_p90_s: float
    follow_up_prompt_tokens: float
    cold_prompt_tokens: float
    hit_rate: float
    jobs_per_worker: list[int]
    distinct_jobs_per_s: float | None
    load_1m: tuple[float, float]
    """The 1-minute load average as the row started and as it ended."""

    @property
    def balance(self) -> float:
        """The busiest worker's jobs against the mean."""
        return max(self.jobs_per_worker) / statistics.mean(self.jobs_per_worker)

    def as_dict(self) -> dict:
        return {**asdict(self), "label": self.variant.label, "balance": self.balance}


def summarize(
    variant: Variant,
    traffic: RowTraffic,
    distinct: float | None,
    baseline: bool,
    load_1m: tuple[float, float],
) -> Row:
    cold = [r for r in traffic.requests if r.kind == "cold"]
    follow_ups = [r for r in traffic.requests if r.kind == "follow-up"]
    return Row(
        variant=variant,
        baseline=baseline,
        cold_p50_s=_p(cold, 0.5),
        cold_p90_s=_p(cold, 0.9),
        follow_up_p50_s=_p(follow_ups, 0.5),
        follow_up_p90_s=_p(follow_ups, 0.9),
        follow_up_prompt_tokens=statistics.mean(r.prompt_tokens for r in follow_ups),
        cold_prompt_tokens=statistics.mean(r.prompt_tokens for r in cold),
        hit_rate=(
            sum(r.cached_tokens for r in follow_ups) / sum(r.prompt_tokens for r in follow_ups)
        ),
        jobs_per_worker=sorted(traffic.jobs_per_worker.values(), reverse=True),
        distinct_jobs_per_s=distinct,
        load_1m=load_1m,
    )


def _p(requests: list[Request], share: float) -> float:
    """The `share` quantile of the requests' TTFT (nearest rank)."""
    ordered = sorted(r.ttft_s for r in requests)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def table(rows: list[Row]) -> str:
    base = next((row for row in rows if row.baseline), None)
    one_worker = {
        row.variant.engine: row for row in rows if row.variant.workers == 1 and not row.baseline
    }
    lines = [
        "| engine | workers | cache | placement | cold p50 ms | cold p90 ms | follow-up p50 ms "
        "| follow-up p90 ms | follow-up p90 / cold p50 | follow-up p50 vs baseline "
        "| hit rate | vs 1 worker | jobs per worker | busiest / mean | distinct jobs/s "
        "| vs baseline | load (1 min) |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for row in rows:
        v = row.variant
        single = one_worker.get(v.engine)
        lines.append(
            f"| {v.engine}{' (baseline)' if row.baseline else ''} | {v.workers} "
            f"| {_on(v.cache if v.engine == 'transformers' else True)} | {_on(v.placement)} "
            f"| {_ms(row.cold_p50_s)} | {_ms(row.cold_p90_s)} | {_ms(row.follow_up_p50_s)} "
            f"| {_ms(row.follow_up_p90_s)} | {row.follow_up_p90_s / row.cold_p50_s:.2f}x "
            f"| {_ratio(row.follow_up_p50_s, base.follow_up_p50_s if base else None)} "
            f"| {row.hit_rate:.1%} "
            f"| {_ratio(row.hit_rate, single.hit_rate if single and not row.baseline else None)} "
            f"| {'/'.join(map(str, row.jobs_per_worker))} | {row.balance:.2f} "
            f"| {_rate(row.distinct_jobs_per_s)} "
            f"| {_ratio(row.distinct_jobs_per_s, base.distinct_jobs_per_s if base else None)} "
            f"| {row.load_1m[0]:.1f} to {row.load_1m[1]:.1f} |"
        )
    return "\n".join(lines)


def targets(rows: list[Row]) -> str:
    """The issue's targets on 2 workers, each met or missed, per engine."""
    lines = []
    base = next((row for row in rows if row.baseline), None)
    for engine in dict.fromkeys(row.variant.engine for row in rows if not row.baseline):
        two = _find(rows, engine, 2)
        one = _find(rows, engine, 1)
        if two is None:
            continue
        ratio = two.follow_up_p90_s / two.cold_p50_s
        lines.append(
            _target(
                f"{engine}: follow-up TTFT p90 <= {FOLLOW_UP_P90_VS_COLD_P50}x cold p50",
                f"{ratio:.2f}x",
                ratio <= FOLLOW_UP_P90_VS_COLD_P50,
            )
        )
        if one is not None and one.hit_rate > 0:
            share = two.hit_rate / one.hit_rate
            lines.append(
                _target(
                    f"{engine}: hit rate on 2 workers >= "
                    f"{HIT_RATE_VS_ONE_WORKER:.0%} of 1 worker's",
                    f"{two.hit_rate:.1%} / {one.hit_rate:.1%} = {share:.1%}",
                    share >= HIT_RATE_VS_ONE_WORKER,
                )
            )
        lines.append(
            _target(
                f"{engine}: no worker above {MAX_LOAD_VS_MEAN}x the mean load",
                f"busiest {two.balance:.2f}x ({'/'.join(map(str, two.jobs_per_worker))})",
                two.balance <= MAX_LOAD_VS_MEAN,
            )
        )
        if base and base.distinct_jobs_per_s and two.distinct_jobs_per_s:
            share = two.distinct_jobs_per_s / base.distinct_jobs_per_s
            lines.append(
                _target(
                    f"{engine}: no-shared-prefix throughput >= "
                    f"{DISTINCT_THROUGHPUT_VS_BASELINE}x the baseline's",
                    f"{share:.2f}x",
                    share >= DISTINCT_THROUGHPUT_VS_BASELINE,
                )
            )
    return "\n".join(lines)


def _find(rows: list[Row], engine: str, workers: int) -> Row | None:
    return next(
        (
            r
            for r in rows
            if r.variant.engine == engine and r.variant.workers == workers and not r.baseline
        ),
        None,
    )


def _target(what: str, measured: str, met: bool) -> str:
    return f"- {what}: {measured}, {'met' if met else 'missed'}"


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ratio(value: float | None, against: float | None) -> str:
    if value is None or not against:
        return "-"
    return f"{value / against:.2f}x"
