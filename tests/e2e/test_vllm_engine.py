"""The vLLM engine (`TOKENRELAY_ENGINE=vllm`) through real processes: our API, and a worker
run by the vLLM environment's Python (`.venv-vllm`, made by `.ci/run`), on a tiny Qwen2 with
the head size vLLM's CPU attention needs.

Skipped where that environment is missing, unless `TOKENRELAY_REQUIRE_VLLM=1` (CI sets it):
then a missing environment fails the run instead of skipping it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import MODEL_NAME, Cluster, running_cluster
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("TOKENRELAY_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
# vLLM's start-up (imports, model load, KV cache, warm-up) takes 20-75 s on two cores.
VLLM_READY_TIMEOUT_S = 300.0
# The module's first test also waits for the worker: its pytest timeout must cover that wait.
pytestmark = pytest.mark.timeout(VLLM_READY_TIMEOUT_S + 120)
LEASE_TTL_S = 3
PREFILL_TOKENS = 64
VLLM_ENV = {
    "TOKENRELAY_ENGINE": "vllm",
    "TOKENRELAY_WORKER_CONCURRENCY": "4",
    "TOKENRELAY_WORKER_MAX_PREFILL_TOKENS": str(PREFILL_TOKENS),
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
}


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    if not VLLM_PYTHON.exists():
        message = (
            f"no vLLM environment at {VLLM_PYTHON}"
            " (.ci/run and docs/operations/vllm-engine.md make one)"
        )
        if os.environ.get("TOKENRELAY_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return VLLM_PYTHON


@pytest.fixture(scope="module")
def h32_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenrelay.worker.devmodels.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-h32"), shape="tiny-h32")


@pytest.fixture(scope="module")
def cluster(
    vllm_python: Path, h32_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    settings = {"TOKENRELAY_LEASE_TTL_S": str(LEASE_TTL_S), "TOKENRELAY_MAX_INFLIGHT": "16"}
    logs = tmp_path_factory.mktemp("vllm-logs")
    with running_cluster(h32_model_dir, logs, settings, workers=0) as cluster:
        start_vllm_worker(cluster, vllm_python)
        yield cluster


def start_vllm_worker(cluster: Cluster, vllm_python: Path) -> None:
    cluster.start_worker(VLLM_ENV, python=str(vllm_python), ready_timeout_s=VLLM_READY_TIMEOUT_S)


def chat(prompt: str, tokens: int, **fields: object) -> dict[str, object]:
    return {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        **fields,
    }


def stream_text(http: httpx.Client, body: dict[str, object]) -> tuple[str, list[dict]]:
    """The streamed text of a chat completion and its parsed chunks."""
    chunks = []
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return text, chunks


def test_stream_and_non_stream_answer_with_usage(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=120) as http:
        body = chat("hello there", 12, seed=3, temperature=0.8)
        reply = http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        data = reply.json()
        assert data["usage"]["completion_tokens"] == 12
        assert data["choices"][0]["finish_reason"] == "length"
        text, chunks = stream_text(http, {**body, "stream_options": {"include_usage": True}})
        assert text == data["choices"][0]["message"]["content"]
        assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_a_seed_gives_the_same_text_alone_and_in_a_changing_batch(cluster: Cluster) -> None:
    body = chat("tell me a story", 24, seed=11, temperature=1.0)
    with httpx.Client(base_url=cluster.base_url, timeout=180) as http:
        alone, _ = stream_text(http, body)
        others = [chat(f"noise {i}", 8 + 4 * i, seed=i, temperature=1.0) for i in range(3)]
        submitted = [http.post("/v1/jobs", json=other).json()["id"] for other in others]
        shared, _ = stream_text(http, body)
        for job_id in submitted:
            eventually(
                lambda job_id=job_id: (
                    http.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"
                ),
                120,
                f"job {job_id} to succeed",
            )
    assert alone and shared == alone


def test_a_prompt_longer_than_a_prefill_step_keeps_its_seed(cluster: Cluster) -> None:
    """On CPU no prompt is split (vLLM's chunked prefill would kill the engine for a seeded
    request): a prompt of several `WORKER_MAX_PREFILL_TOKENS` runs whole, alongside others."""
    long_prompt = " ".join(f"word{i}" for i in range(6 * PREFILL_TOKENS))
    with httpx.Client(base_url=cluster.base_url, timeout=180) as http:
        jobs = [
            http.post("/v1/jobs", json=chat(long_prompt, 6, seed=s, temperature=1.0)).json()["id"]
            for s in (1, 2, 1)
        ]
        records = []
        for job_id in jobs:
            eventually(
                lambda job_id=job_id: (
                    http.get(f"/v1/jobs/{job_id}").json()["status"] not in ("queued", "running")
                ),
                120,
                f"job {job_id} to end",
            )
            records.append(http.get(f"/v1/jobs/{job_id}").json())
    assert [r["status"] for r in records] == ["succeeded"] * 3
    assert records[0]["usage"]["prompt_tokens"] > 4 * PREFILL_TOKENS
    assert records[0]["text"] == records[2]["text"]


def test_cancel_stops_a_running_job_within_a_step(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        job_id = http.post("/v1/jobs", json=chat("go on", 1500)).json()["id"]
        eventually(
            lambda: http.get(f"/v1/jobs/{job_id}").json()["text"], 120, "the job's first text"
        )
        assert http.delete(f"/v1/jobs/{job_id}").status_code == 200
        eventually(
            lambda: http.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled",
            10,
            "the running job to be cancelled",
        )
        record = http.get(f"/v1/jobs/{job_id}").json()
    assert record["finish_reason"] != "length"
    assert record["usage"] is None or record["usage"]["completion_tokens"] < 1500


def test_a_killed_vllm_workers_job_continues_on_the_next_vllm_worker(
    cluster: Cluster, vllm_python: Path
) -> None:
    """The job goes back to its queue with the tokens it delivered (issue 36) and the next
    vLLM worker prefills them after the prompt and generates only the rest."""
    import redis

    worker = next(c for c in cluster.group.children if c.name == "worker")
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        job_id = http.post("/v1/jobs", json=chat("keep going", 1500)).json()["id"]
        eventually(
            lambda: http.get(f"/v1/jobs/{job_id}").json()["status"] == "running",
            120,
            "the job to start",
        )
        worker.kill()
        cluster.group.remove(worker)
        eventually(
            lambda: http.get(f"/v1/jobs/{job_id}").json()["status"] == "queued",
            LEASE_TTL_S + 10,
            "the lost job to go back to its queue",
        )
        start_vllm_worker(cluster, vllm_python)  # later tests in this module need one too
        eventually(
            lambda: http.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded",
            180,
            "the continued job to finish",
        )
        record = http.get(f"/v1/jobs/{job_id}").json()
    assert record["attempts"] == 2 and len(record["workers"]) == 2
    assert record["usage"]["completion_tokens"] == 1500
    with redis.Redis.from_url(cluster.redis_url) as client:
        assert client.zcard(keys.leases()) == 0


def greedy_token_id(model_dir: Path, token: bytes) -> int:
    """The id of the token whose bytes are `token` (OpenAI's logprobs name tokens by bytes)."""
    from transformers import AutoTokenizer

    from tokenrelay.worker.engines.token_bytes import TokenBytes

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    bytes_of = TokenBytes(tokenizer)
    return next(i for i in range(len(tokenizer)) if bytes_of(i) == token)


def test_logprobs_logit_bias_and_a_json_schema_through_vllm(
    cluster: Cluster, h32_model_dir: Path
) -> None:
    """The OpenAI sampling surface reaches vLLM's own implementations: raw log probabilities
    with the likeliest candidates, a bias that bans the greedy token, and a schema enforced
    by vLLM's structured outputs."""
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "enum": [1, 2, 3]}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    with httpx.Client(base_url=cluster.base_url, timeout=120) as http:
        greedy = {"temperature": 0, "max_tokens": 4, "logprobs": True, "top_logprobs": 2}
        first = http.post("/v1/chat/completions", json=chat("hi", 4, **greedy)).json()
        content = first["choices"][0]["logprobs"]["content"]
        assert len(content) == first["usage"]["completion_tokens"] == 4
        assert all(len(entry["top_logprobs"]) == 2 for entry in content)
        top = content[0]["top_logprobs"][0]
        assert content[0]["logprob"] == pytest.approx(top["logprob"], abs=1e-4)
        banned = greedy_token_id(h32_model_dir, bytes(content[0]["bytes"]))
        biased = {**greedy, "logit_bias": {str(banned): -100}}
        other = http.post("/v1/chat/completions", json=chat("hi", 4, **biased)).json()
        assert other["choices"][0]["logprobs"]["content"][0]["bytes"] != content[0]["bytes"]
        structured = {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": True},
            },
            "temperature": 1.0,
            "seed": 5,
            "max_tokens": 60,
        }
        reply = http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": "go"}],
                **structured,
            },
        )
        assert reply.status_code == 200, reply.text
        document = json.loads(reply.json()["choices"][0]["message"]["content"])
        assert set(document) == {"ok", "n"}
        assert isinstance(document["ok"], bool) and document["n"] in (1, 2, 3)


def test_a_forced_tool_call_through_vllm_is_valid_json_for_its_parameters(
    cluster: Cluster,
) -> None:
    """A named `tool_choice` reaches vLLM's structured outputs as the tool-call grammar: the
    reply is one call of that function whose arguments match its bounded parameters."""
    parameters = {
        "type": "object",
        "properties": {
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "enum": [1, 2, 3]},
        },
        "required": ["unit", "days"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": parameters}}]
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 1.0,
        "seed": 3,
        "max_tokens": 80,
    }
    with httpx.Client(base_url=cluster.base_url, timeout=120) as http:
        reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    assert arguments["unit"] in ("celsius", "fahrenheit") and arguments["days"] in (1, 2, 3)
