"""The web console: `GET /v1/cluster` in-process against a real Redis, the static files under
`/ui`, and the page itself in headless Chromium (Playwright) against real processes."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import rq
from fastapi.testclient import TestClient

from tokenrelay.api.app import create_app
from tokenrelay.api.middleware.request_log import LOGGER_NAME, POLL_HEADER
from tokenrelay.api.routes.console import STATIC_DIR
from tokenrelay.shared.redis import job_scripts, keys
from tokenrelay.shared.redis.rq_jobs import GENERATE_FUNCTION
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.worker.rq_worker import StartSignal, build_worker

SECRET = "the secret prompt 🌊 nobody else may read"
MESSAGES = [
    {"role": "system", "content": f"system: {SECRET}"},
    {"role": "user", "content": SECRET},
]
USER_KEY = "sk-user"
ADMIN_KEY = "sk-admin"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def open_client(redis_url: str) -> Iterator[TestClient]:
    settings = Settings(redis_url=redis_url, served_model_name="m", max_inflight=1)
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture
def keyed_client(redis_url: str) -> Iterator[TestClient]:
    settings = Settings(
        redis_url=redis_url, served_model_name="m", api_keys=[USER_KEY], admin_api_keys=[ADMIN_KEY]
    )
    with TestClient(create_app(settings)) as client:
        yield client


def test_cluster_view_reports_admission_queues_jobs_and_rejections(
    open_client: TestClient,
) -> None:
    body = {"model": "m", "messages": MESSAGES}
    job_id = open_client.post("/v1/jobs", json=body).json()["id"]
    refused = open_client.post("/v1/chat/completions", json=body)
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == "1"

    response = open_client.get("/v1/cluster")
    assert response.status_code == 200
    view = response.json()
    assert view["model"] == "m"
    assert (view["in_flight"], view["max_inflight"]) == (1, 1)
    assert view["queues"] == [  # every priority of the served model, before any job used it
        {"name": keys.generation_queue("m", priority), "queued": int(priority == "normal")}
        for priority in ("high", "normal", "low")
    ]
    assert view["workers"] == []
    assert view["rejections"] == {"cluster_overloaded": 1}
    [job] = view["recent_jobs"]
    assert (job["id"], job["status"], job["model"]) == (job_id, "queued", "m")
    assert job["queue_wait_s"] >= 0
    assert job["started_at"] is None and job["run_s"] is None
    assert SECRET not in response.text and "secret" not in response.text


def test_cluster_view_lists_workers_with_the_jobs_they_run(
    open_client: TestClient, redis_url: str, sync_redis: redis.Redis
) -> None:
    job_id = open_client.post("/v1/jobs", json={"model": "m", "messages": MESSAGES}).json()["id"]
    settings = Settings(redis_url=redis_url)
    SyncScripts(sync_redis).run(
        job_scripts.register_worker(settings, "console-test-worker", "m", 3)
    )
    seen: list[dict[str, Any]] = []
    start_signal = StartSignal()

    def generate(job_id: str, request: dict[str, object]) -> dict[str, str]:
        start_signal.started()  # as the worker's job runner does once the job is in the batch
        seen.append(open_client.get("/v1/cluster").json())
        return {"status": "succeeded"}

    connection = redis.Redis.from_url(redis_url)
    try:
        build_worker(
            connection,
            "console-test-worker",
            {GENERATE_FUNCTION: generate},
            model="m",
            start_signal=start_signal,
        ).work(burst=True)
    finally:
        connection.close()
    [view] = seen
    [worker] = view["workers"]
    assert worker["name"] == "console-test-worker"
    assert worker["state"] == "busy"
    assert worker["running"] == [job_id]
    assert worker["model"] == "m"
    assert worker["capacity"] == 3  # its registration, not the API's TOKENRELAY_WORKER_CONCURRENCY
    assert isinstance(worker["last_heartbeat"], float)
    assert abs(worker["last_heartbeat"] - view["now"]) < 60
    assert SECRET not in str(view)


def test_cluster_view_shows_each_workers_own_model_and_capacity_and_no_foreign_rq(
    open_client: TestClient, redis_url: str, sync_redis: redis.Redis
) -> None:
    settings = Settings(redis_url=redis_url)
    SyncScripts(sync_redis).run(job_scripts.register_worker(settings, "w-other", "other", 2))
    connection = redis.Redis.from_url(redis_url)
    try:
        build_worker(connection, "w-other", {}, model="other").register_birth()
        build_worker(connection, "w-unregistered", {}, model="m").register_birth()
        # another application's RQ queue (with a job) and worker, in the same Redis
        rq.Queue("emails", connection=connection).enqueue_call("mailer.send")
        rq.Worker(["emails"], name="mailer", connection=connection).register_birth()
        view = open_client.get("/v1/cluster").json()
    finally:
        connection.close()
    assert view["model"] == "m"
    workers = {worker["name"]: worker for worker in view["workers"]}
    assert set(workers) == {"w-other", "w-unregistered"}
    assert (workers["w-other"]["model"], workers["w-other"]["capacity"]) == ("other", 2)
    # not registered (yet): the model its queues name, and no capacity
    assert (workers["w-unregistered"]["model"], workers["w-unregistered"]["capacity"]) == (
        "m",
        None,
    )
    # every priority of each model served here or by a worker, none of another application's
    assert [queue["name"] for queue in view["queues"]] == [
        keys.generation_queue(model, priority)
        for model in ("m", "other")
        for priority in ("high", "normal", "low")
    ]
    assert {queue["queued"] for queue in view["queues"]} == {0}


def test_the_consoles_polls_are_logged_at_debug(
    open_client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """An open console refreshes its views every second: those requests carry the poll
    header (as `tokenrelay top`'s do) and stay out of the INFO log."""
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    assert open_client.get("/v1/cluster", headers={POLL_HEADER: "1"}).status_code == 200
    assert open_client.get("/v1/cluster").status_code == 200
    levels = [record.levelno for record in caplog.records if record.name == LOGGER_NAME]
    assert levels == [logging.DEBUG, logging.INFO]
    script = (STATIC_DIR / "console.js").read_text()
    assert re.search(rf'"{POLL_HEADER}": "1"', script, re.IGNORECASE)


def test_cluster_view_needs_an_admin_key_when_keys_are_on(keyed_client: TestClient) -> None:
    missing = keyed_client.get("/v1/cluster")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    forbidden = keyed_client.get("/v1/cluster", headers=bearer(USER_KEY))
    assert forbidden.status_code == 403
    assert forbidden.json()["error"] == {
        "message": "this route needs an admin API key (TOKENRELAY_ADMIN_API_KEYS)",
        "type": "permission_error",
        "param": None,
        "code": "forbidden",
    }
    assert keyed_client.get("/v1/cluster", headers=bearer(ADMIN_KEY)).status_code == 200
    # an admin key is also a normal key, and owns the jobs it submits
    body = {"model": "m", "messages": MESSAGES}
    created = keyed_client.post("/v1/jobs", json=body, headers=bearer(ADMIN_KEY))
    assert created.status_code == 202
    job_path = f"/v1/jobs/{created.json()['id']}"
    assert keyed_client.get(job_path, headers=bearer(ADMIN_KEY)).status_code == 200
    assert keyed_client.get(job_path, headers=bearer(USER_KEY)).status_code == 404


def test_admin_keys_alone_turn_authentication_on(redis_url: str) -> None:
    settings = Settings(redis_url=redis_url, served_model_name="m", admin_api_keys=[ADMIN_KEY])
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/models").status_code == 401
        assert client.get("/v1/models", headers=bearer(ADMIN_KEY)).status_code == 200


def test_admin_api_keys_setting_accepts_a_comma_separated_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOKENRELAY_ADMIN_API_KEYS", "a, b,,c")
    assert Settings().admin_api_keys == ["a", "b", "c"]


def test_cluster_view_limit_is_bounded(open_client: TestClient) -> None:
    assert open_client.get("/v1/cluster?limit=0").status_code == 400
    too_many = open_client.get(f"/v1/cluster?limit={job_scripts.RECENT_JOBS_KEPT + 1}")
    assert too_many.status_code == 400
    assert too_many.json()["error"]["param"] == "query.limit"


def test_admission_keeps_a_capped_newest_first_list_of_recent_jobs(
    sync_redis: redis.Redis, redis_url: str
) -> None:
    settings = Settings(redis_url=redis_url, max_inflight=1000)
    run = SyncScripts(sync_redis)
    job_ids = [f"job{i}" for i in range(job_scripts.RECENT_JOBS_KEPT + 5)]
    for job_id in job_ids:
        job_scripts.check_admitted(run.run(job_scripts.admit(settings, job_id, "owner", "m")))
    recent = sync_redis.lrange(keys.recent_jobs(), 0, -1)
    assert recent == job_ids[::-1][: job_scripts.RECENT_JOBS_KEPT]
    assert not sync_redis.exists(keys.rejections())


def test_console_files_are_served_from_the_package(open_client: TestClient) -> None:
    redirect = open_client.get("/ui", follow_redirects=False)
    assert redirect.status_code == 308
    assert redirect.headers["location"] == "ui/"
    page = open_client.get("/ui/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert 'src="console.js"' in page.text and 'href="console.css"' in page.text
    script = open_client.get("/ui/console.js")
    assert script.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    assert open_client.get("/ui/console.css").headers["content-type"].startswith("text/css")
    for missing in ("/ui/nope.js", "/ui/..%2Fapp.py", "/ui/%2e%2e%2Fcluster_view.py"):
        response = open_client.get(missing)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_console_loads_nothing_from_outside() -> None:
    """No CDN: many clusters (and these machines) have no internet."""
    for path in STATIC_DIR.iterdir():
        text = path.read_text()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), path


# ---- the page in a real browser, against real processes ---------------------------------
