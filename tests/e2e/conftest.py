"""The clients most e2e modules read their `cluster` fixture with: the official `openai`
client (no retries, so a refusal shows as it is) and a plain `httpx` client. A module that
needs other keys or options defines its own `client` or `http`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.cluster import Cluster


@pytest.fixture
def client(cluster: Cluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture
def http(cluster: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.base_url, timeout=30) as c:
        yield c
