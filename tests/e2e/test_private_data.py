"""No prompt or reply text in any process's log at default settings, nor in RQ's job
description in Redis: every generation route, through real API and worker processes."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.testing.polling import eventually

#: Replies at least this long are looked for in the logs (a shorter one could be there by chance).
MIN_REPLY_CHARS = 12
#: Each prompt starts with this and 16 random characters; any 4 of them in a log is a leak
#: (RQ's job description shows a truncated call string: the prompt's first characters).
PROMPT_MARK = "Zq"
LEAK_CHARS = 4


def secret() -> str:
    return f"{PROMPT_MARK}{uuid.uuid4().hex[:16]}"


def generate_on_every_route(http: httpx.Client) -> tuple[list[str], list[str], list[str]]:
    """Prompts sent, replies received and job ids, through each generation route."""
    prompts: list[str] = []
    replies: list[str] = []
    job_ids: list[str] = []

    def chat(**fields: object) -> dict[str, object]:
        prompt = secret()
        prompts.append(prompt)
        messages = [{"role": "user", "content": prompt}]
        return {"model": MODEL_NAME, "messages": messages, "max_tokens": 16, **fields}

    reply = http.post("/v1/chat/completions", json=chat(min_tokens=16)).json()
    replies.append(reply["choices"][0]["message"]["content"])
    job_ids.append(reply["id"].removeprefix("chatcmpl-"))
    streamed = http.post("/v1/chat/completions", json=chat(stream=True, min_tokens=16)).text
    chunks = [json.loads(line[6:]) for line in streamed.splitlines() if line[6:7] == "{"]
    replies.append("".join(c["choices"][0]["delta"].get("content") or "" for c in chunks))
    prompt = secret()
    prompts.append(prompt)
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 16, "min_tokens": 16}
    replies.append(http.post("/v1/completions", json=body).json()["choices"][0]["text"])
    prompt = secret()
    prompts.append(prompt)
    replies.append(http.post("/", json={"prompt": prompt, "max_tokens": 16}).json()["response"])
    query, system, stop = secret(), secret(), secret()
    prompts += [query, system, stop]
    body = {"query": query, "system": system, "user_stop_words": [stop], "max_tokens": 16}
    replies.append(http.post("/chat", json=body).json()["text"])
    job = http.post("/v1/jobs", json=chat(min_tokens=16)).json()
    job_ids.append(job["id"])
    eventually(
        lambda: http.get(f"/v1/jobs/{job['id']}").json()["status"] == "succeeded",
        timeout_s=60,
        what="the async job to finish",
    )
    replies.append(http.get(f"/v1/jobs/{job['id']}").json()["text"])
    cancelled = http.post("/v1/jobs", json=chat(max_tokens=1800, min_tokens=1800)).json()
    assert http.delete(f"/v1/jobs/{cancelled['id']}").status_code == 200
    too_long = http.post(
        "/v1/chat/completions",
        json=chat(max_tokens=16)
        | {"messages": [{"role": "user", "content": secret() + " x" * 5000}]},
    )
    assert too_long.status_code == 400
    return prompts, replies, job_ids


@pytest.fixture
def cluster(make_cluster: ClusterFactory) -> Cluster:
    return make_cluster({"TOKENRELAY_WORKER_CONCURRENCY": "2"})


def test_no_prompt_or_reply_in_any_log_or_rq_description(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        prompts, replies, job_ids = generate_on_every_route(http)
    cluster.stop()  # flushes every log
    logs = {path.name: path.read_text() for path in cluster.log_dir.glob("*.log")}
    assert {"api", "worker"} <= {name.split("-")[0] for name in logs}
    assert any("job" in text for name, text in logs.items() if name.startswith("worker"))
    long_replies = [reply for reply in replies if len(reply.strip()) >= MIN_REPLY_CHARS]
    assert long_replies, f"no reply long enough to look for: {replies}"
    for name, text in logs.items():
        for prompt in prompts:
            assert prompt[:LEAK_CHARS] not in text, f"{name} logs a prompt ({prompt})"
        for reply in long_replies:
            assert reply.strip() not in text, f"{name} logs a reply"
    connection = redis.Redis.from_url(cluster.redis_url)
    try:
        for job_id in job_ids:
            job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
            assert job.description is not None
            assert job_id in job.description
            assert not any(prompt[:LEAK_CHARS] in job.description for prompt in prompts)
    finally:
        connection.close()
