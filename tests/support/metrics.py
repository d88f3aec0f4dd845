"""Reading a Prometheus text scrape in tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> tuple[set[str], Samples]:
    """Family names and `(sample name, labels) -> value` of a Prometheus text scrape."""
    families = list(text_string_to_metric_families(text))
    samples = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in families
        for sample in family.samples
    }
    return {family.name for family in families}, samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))
