"""Routing through real processes: priorities, per-key quotas, several models."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.api.api_keys import hash_key
from tokenrelay.testing.polling import eventually

MESSAGES = [{"role": "user", "content": "go"}]
BLOCKER = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 1500, "min_tokens": 1500}
SHORT = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 2, "min_tokens": 2}


@pytest.fixture
def cluster(make_cluster: ClusterFactory, tmp_path: Path) -> Cluster:
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(
        json.dumps(
            [
                {"sha256": hash_key("team-a"), "name": "a", "max_inflight": 2},
                {"sha256": hash_key("vip"), "name": "vip", "priority": "high"},
            ]
        )
    )
    settings = {
        "TOKENRELAY_WORKER_CONCURRENCY": "1",
        "TOKENRELAY_MAX_INFLIGHT": "100",
        "TOKENRELAY_API_KEYS_FILE": str(keys_file),
        "TOKENRELAY_LEASE_TTL_S": "2",
    }
    return make_cluster(settings, workers=0, api_workers=0)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def wait_done(http: httpx.Client, job_id: str, key: str) -> list[dict[str, object]]:
    with http.stream("GET", f"/v1/jobs/{job_id}/events", headers=auth(key)) as response:
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def test_high_priority_job_starts_before_50_queued_normal_ones(cluster: Cluster) -> None:
    cluster.start_worker()
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        blocker = http.post("/v1/jobs", json=BLOCKER, headers=auth("vip")).json()["id"]
        normal = [
            http.post("/v1/jobs", json={**SHORT, "priority": "normal"}, headers=auth("vip")).json()[
                "id"
            ]
            for _ in range(50)
        ]
        by_request = http.post("/v1/jobs", json={**SHORT, "priority": "high"}, headers=auth("vip"))
        by_key = http.post("/v1/jobs", json=SHORT, headers=auth("vip"))
        high = [by_request.json()["id"], by_key.json()["id"]]
        http.delete(f"/v1/jobs/{blocker}", headers=auth("vip"))
        for job_id in high:
            assert wait_done(http, job_id, "vip")[-1]["type"] == "done"
        records = [http.get(f"/v1/jobs/{j}", headers=auth("vip")).json() for j in normal]
        started_normal = [r["started_at"] for r in records if r["started_at"] is not None]
        last_high = max(
            http.get(f"/v1/jobs/{j}", headers=auth("vip")).json()["started_at"] for j in high
        )
        assert all(s > last_high for s in started_normal)
        for job_id in normal:
            http.delete(f"/v1/jobs/{job_id}", headers=auth("vip"))


def test_per_key_limit_is_a_429_and_frees_when_a_job_ends(cluster: Cluster) -> None:
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        first = [http.post("/v1/jobs", json=SHORT, headers=auth("team-a")) for _ in range(2)]
        assert [r.status_code for r in first] == [202, 202]
        refused = http.post("/v1/jobs", json=SHORT, headers=auth("team-a"))
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(refused.headers["Retry-After"]) >= 1
        assert http.post("/v1/jobs", json=SHORT, headers=auth("vip")).status_code == 202
        http.delete(f"/v1/jobs/{first[0].json()['id']}", headers=auth("team-a"))
        assert http.post("/v1/jobs", json=SHORT, headers=auth("team-a")).status_code == 202
        assert http.get("/v1/models").status_code == 401


def test_model_field_routes_to_that_models_workers(cluster: Cluster) -> None:
    cluster.start_worker()
    other = cluster.start_worker({"TOKENRELAY_SERVED_MODEL_NAME": "tiny-b"})
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        models = http.get("/v1/models", headers=auth("vip")).json()["data"]
        assert sorted(m["id"] for m in models) == [MODEL_NAME, "tiny-b"]
        for model in (MODEL_NAME, "tiny-b"):
            job = http.post("/v1/jobs", json={**SHORT, "model": model}, headers=auth("vip")).json()
            events = wait_done(http, job["id"], "vip")
            assert events[-1]["type"] == "done"
            record = http.get(f"/v1/jobs/{job['id']}", headers=auth("vip")).json()
            assert record["model"] == model
        unknown = http.post("/v1/jobs", json={**SHORT, "model": "nope"}, headers=auth("vip"))
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
        other.kill()

        def listed() -> list[str]:
            return [m["id"] for m in http.get("/v1/models", headers=auth("vip")).json()["data"]]

        # The worker's registration outlives it by <= 2 s.
        eventually(lambda: listed() == [MODEL_NAME], 10, "the dead worker's model to go")
        gone = http.post("/v1/jobs", json={**SHORT, "model": "tiny-b"}, headers=auth("vip"))
        assert gone.status_code == 503
        assert gone.json()["error"]["code"] == "model_unavailable"
