"""The Files API through a real API process with the openai SDK: upload (streamed to Redis
in chunks), list, retrieve, download, delete, limits, and another key's files answering 404."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import httpx
import openai
import pytest
import redis

from tests.support.cluster import Cluster, ClusterFactory
from tokenrelay.api.files.store import CHUNK_BYTES
from tokenrelay.shared.redis import keys

KEY_A, KEY_B = "sk-files-a", "sk-files-b"
MAX_BYTES = 3 * CHUNK_BYTES + 1000
MAX_REQUESTS = 40


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    settings = {
        "TOKENRELAY_API_KEYS": f"{KEY_A},{KEY_B}",
        "TOKENRELAY_FILE_MAX_BYTES": str(MAX_BYTES),
        "TOKENRELAY_FILE_MAX_REQUESTS": str(MAX_REQUESTS),
    }
    return make_module_cluster(settings, workers=0)


def _client(cluster: Cluster, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key=key, max_retries=0)


@pytest.fixture
def client(cluster: Cluster) -> Iterator[openai.OpenAI]:
    with _client(cluster, KEY_A) as c:
        yield c


@pytest.fixture
def other(cluster: Cluster) -> Iterator[openai.OpenAI]:
    with _client(cluster, KEY_B) as c:
        yield c


def _lines(n: int, pad: int = 0) -> bytes:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x" * pad}]}
    return b"".join(
        json.dumps(
            {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        ).encode()
        + b"\n"
        for i in range(n)
    )


def test_upload_retrieve_download_and_delete(client: openai.OpenAI, cluster: Cluster) -> None:
    content = _lines(20, pad=CHUNK_BYTES // 8)  # spans several stored chunks
    assert len(content) > 2 * CHUNK_BYTES
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
    assert uploaded.id.startswith("file-")
    assert (uploaded.bytes, uploaded.filename, uploaded.purpose) == (
        len(content),
        "in.jsonl",
        "batch",
    )
    assert uploaded.status == "processed"
    assert client.files.retrieve(uploaded.id).model_dump() == uploaded.model_dump()
    assert client.files.content(uploaded.id).read() == content
    stored = redis.Redis.from_url(cluster.redis_url)
    try:
        chunks = stored.lrange(keys.file_chunks(uploaded.id), 0, -1)
        assert len(chunks) == -(-len(content) // CHUNK_BYTES)
        assert max(len(chunk) for chunk in chunks) <= CHUNK_BYTES
        assert 0 < stored.ttl(keys.file(uploaded.id)) <= 2_592_000
        deleted = client.files.delete(uploaded.id)
        assert (deleted.id, deleted.deleted) == (uploaded.id, True)
        assert not stored.exists(keys.file(uploaded.id), keys.file_chunks(uploaded.id))
    finally:
        stored.close()
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_list_pages_newest_first(client: openai.OpenAI) -> None:
    made = [
        client.files.create(file=(f"{i}.jsonl", io.BytesIO(_lines(1))), purpose="batch").id
        for i in range(3)
    ]
    first = client.files.list(limit=2)
    assert [f.id for f in first.data] == made[::-1][:2]
    assert first.has_more
    second = client.files.list(limit=2, after=first.data[-1].id)
    assert made[0] in [f.id for f in second.data]
    everything = [f.id for f in client.files.list(order="asc")]
    assert everything.index(made[0]) < everything.index(made[2])


def test_another_keys_file_is_404_everywhere(client: openai.OpenAI, other: openai.OpenAI) -> None:
    mine = client.files.create(file=("a.jsonl", io.BytesIO(_lines(2))), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.files.delete(mine.id)
    assert mine.id not in [f.id for f in other.files.list()]
    assert client.files.retrieve(mine.id).id == mine.id


def test_a_file_over_the_byte_limit_is_413_naming_it_and_nothing_is_kept(
    client: openai.OpenAI, cluster: Cluster
) -> None:
    big = (b" " * (MAX_BYTES // 10) + b"{}\n") * 11
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", io.BytesIO(big)), purpose="batch")
    assert refused.value.status_code == 413
    assert "TOKENRELAY_FILE_MAX_BYTES" in str(refused.value)
    # chunked (no Content-Length): counted as it streams, refused once it crosses the limit
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()

    def body() -> Iterator[bytes]:
        yield head
        for _ in range(MAX_BYTES // CHUNK_BYTES + 2):
            yield b" " * (CHUNK_BYTES - 3) + b"{}\n"
        yield f"\r\n--{boundary}--\r\n".encode()

    answer = httpx.post(
        f"{cluster.base_url}/v1/files",
        content=body(),
        headers={
            "authorization": f"Bearer {KEY_A}",
            "content-type": f"multipart/form-data; boundary={boundary}",
        },
        timeout=30,
    )
    assert answer.status_code == 413, answer.text
    assert "TOKENRELAY_FILE_MAX_BYTES" in answer.json()["error"]["message"]
    stored = redis.Redis.from_url(cluster.redis_url)
    try:
        chunk_lists = {
            k.removesuffix(b":chunks") for k in stored.scan_iter(match=keys.file_chunks("*"))
        }
        assert chunk_lists <= set(stored.scan_iter(match=keys.file("file-*")))  # none orphaned
    finally:
        stored.close()


def test_more_lines_than_the_request_limit_is_400_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(
            file=("many.jsonl", io.BytesIO(_lines(MAX_REQUESTS + 1))), purpose="batch"
        )
    assert "TOKENRELAY_FILE_MAX_REQUESTS" in str(refused.value)
    assert client.files.create(
        file=("enough.jsonl", io.BytesIO(_lines(MAX_REQUESTS))), purpose="batch"
    ).bytes


@pytest.mark.parametrize(
    ("form", "param"),
    [
        ({"purpose": "fine-tune"}, "purpose"),
        ({"purpose": "batch", "extra": "1"}, "extra"),
        ({}, "purpose"),
    ],
)
def test_bad_forms_are_400_naming_the_field(
    cluster: Cluster, form: dict[str, str], param: str
) -> None:
    answer = httpx.post(
        f"{cluster.base_url}/v1/files",
        data=form,
        files={"file": ("a.jsonl", _lines(1))},
        headers={"authorization": f"Bearer {KEY_A}"},
        timeout=10,
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_a_json_body_instead_of_a_form_is_400(cluster: Cluster) -> None:
    answer = httpx.post(
        f"{cluster.base_url}/v1/files",
        json={"purpose": "batch"},
        headers={"authorization": f"Bearer {KEY_A}"},
        timeout=10,
    )
    assert answer.status_code == 400
    assert "multipart/form-data" in answer.json()["error"]["message"]
