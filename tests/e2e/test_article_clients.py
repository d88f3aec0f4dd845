"""The two articles' clients, in their own code shapes (requests, iter_content, split on NUL),
against real `tokenrelay api` and `tokenrelay worker` processes."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import httpx
import pytest
import requests

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.api.routes.article_clients import _PromptSSE


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    return make_module_cluster(
        {"TOKENRELAY_MAX_INFLIGHT": "1", "TOKENRELAY_WORKER_CONCURRENCY": "1"}
    )


# The first article's client, as published (only the URL and a timeout added).
def get_completion(url: str, prompt: str) -> str:
    headers = {"Content-Type": "application/json"}
    data = {"prompt": prompt, "temperature": 0}
    response = requests.post(url=url, headers=headers, data=json.dumps(data), timeout=60)
    return str(response.json()["response"])


def get_completion_stream(url: str, prompt: str) -> Iterator[str]:
    headers = {"Content-Type": "application/octet-stream"}
    data = {"prompt": prompt, "temperature": 0}
    response = requests.post(
        url=url, headers=headers, data=json.dumps(data), stream=True, timeout=60
    )
    assert response.status_code == 200
    for chunk in response.iter_content(chunk_size=512, decode_unicode=True):
        chunk_data = chunk.split("\r\ndata:")[1].split("\r\nretry:")[0]
        yield chunk_data


def test_first_article_client_gets_the_same_text_streamed_and_not(cluster: Cluster) -> None:
    whole = get_completion(cluster.base_url, "你好 🌊\nhello")
    streamed = list(get_completion_stream(cluster.base_url, "你好 🌊\nhello"))
    assert len(streamed) > 1
    assert "".join(json.loads(piece) for piece in streamed) == whole


def test_first_article_sse_keeps_newlines_through_the_articles_parsing() -> None:
    chunk = _PromptSSE().text("line one\nline two\r\n").decode()
    chunk_data = chunk.split("\r\ndata:")[1].split("\r\nretry:")[0]
    assert json.loads(chunk_data) == "line one\nline two\r\n"


def test_first_article_busy_is_a_real_503_with_its_body_shape(cluster: Cluster) -> None:
    long_job = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 1500,
        "min_tokens": 1500,
    }
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        job_id = http.post("/v1/jobs", json=long_job).json()["id"]
        try:
            response = requests.post(cluster.base_url, json={"prompt": "hi"}, timeout=30)
            assert response.status_code == 503
            body = response.json()
            assert set(body) == {"response", "status", "time"}
            assert body["status"] == 503 and "capacity" in body["response"]
            assert response.headers["Retry-After"]
        finally:
            http.delete(f"/v1/jobs/{job_id}")
            with http.stream("GET", f"/v1/jobs/{job_id}/events") as events:
                for _ in events.iter_lines():
                    pass  # drain to the terminal event: the slot is free again
    bad = requests.post(cluster.base_url, json={"prompt": ""}, timeout=30)
    assert bad.status_code == 400 and bad.json()["status"] == 400


def chat(url: str, query: str, **fields: object) -> str:
    response = requests.post(f"{url}/chat", json={"query": query, **fields}, timeout=60)
    assert response.status_code == 200, response.text
    return str(response.json()["text"])


def chat_stream(url: str, query: str, **fields: object) -> list[str]:
    body = {"query": query, "stream": True, **fields}
    response = requests.post(f"{url}/chat", json=body, stream=True, timeout=60)
    texts = []
    for chunk in response.iter_lines(chunk_size=8192, decode_unicode=False, delimiter=b"\0"):
        if chunk:
            texts.append(json.loads(chunk.decode("utf-8"))["text"])
    return texts


def test_second_article_client_stream_is_cumulative_and_matches(cluster: Cluster) -> None:
    history = [["你好", "你好, 有什么可以帮你"]]
    fields = {"history": history, "system": "You are terse.", "max_tokens": 24, "seed": 5}
    whole = chat(cluster.base_url, "写一首诗", **fields)
    texts = chat_stream(cluster.base_url, "写一首诗", **fields)
    assert texts[-1] == whole
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
    raw = requests.post(
        f"{cluster.base_url}/chat", json={"query": "写一首诗", "stream": True, **fields}, timeout=60
    ).content
    frames = [json.loads(part) for part in raw.decode().split("\0") if part]
    assert frames[-1]["text"] == whole


def test_user_stop_words_end_the_run_with_the_stop_word_kept(cluster: Cluster) -> None:
    full = chat(cluster.base_url, "count", max_tokens=40, temperature=1.0, seed=11)
    stop_word = full[10:13]
    assert stop_word.strip(), f"greedy text too short to pick a stop word from: {full!r}"
    cut = chat(
        cluster.base_url,
        "count",
        max_tokens=40,
        temperature=1.0,
        seed=11,
        user_stop_words=[stop_word],
    )
    assert cut.endswith(stop_word)
    assert full.startswith(cut) and len(cut) < len(full)
