"""The web console: `GET /v1/cluster` in-process against a real Redis, the static files under
`/ui`, and the page itself in headless Chromium (Playwright) against real processes."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import rq
from fastapi.testclient import TestClient
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.api.app import create_app
from tokenrelay.api.routes.console import STATIC_DIR
from tokenrelay.cli.harness import eventually
from tokenrelay.shared import keys, scripts
from tokenrelay.shared.rq_jobs import GENERATE_FUNCTION
from tokenrelay.shared.script_runner import SyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.worker.rq_worker import StartSignal, build_worker

SECRET = "the secret prompt 🌊 nobody else may read"
MESSAGES = [
    {"role": "system", "content": f"system: {SECRET}"},
    {"role": "user", "content": SECRET},
]
USER_KEY = "sk-user"
ADMIN_KEY = "sk-admin"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
LONG_JOB_TOKENS = 1800  # many seconds on the tiny model (2048 positions); the test stops it
BROWSER_TIMEOUT_MS = 30_000


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
    assert {"name": keys.generation_queue("m", "normal"), "queued": 1} in view["queues"]
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
    SyncScripts(sync_redis).run(scripts.register_worker(settings, "console-test-worker", "m", 3))
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
    SyncScripts(sync_redis).run(scripts.register_worker(settings, "w-other", "other", 2))
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
    assert view["queues"] == []


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
    too_many = open_client.get(f"/v1/cluster?limit={scripts.RECENT_JOBS_KEPT + 1}")
    assert too_many.status_code == 400
    assert too_many.json()["error"]["param"] == "query.limit"


def test_admission_keeps_a_capped_newest_first_list_of_recent_jobs(
    sync_redis: redis.Redis, redis_url: str
) -> None:
    settings = Settings(redis_url=redis_url, max_inflight=1000)
    run = SyncScripts(sync_redis)
    job_ids = [f"job{i}" for i in range(scripts.RECENT_JOBS_KEPT + 5)]
    for job_id in job_ids:
        scripts.check_admitted(run.run(scripts.admit(settings, job_id, "owner", "m")))
    recent = sync_redis.lrange(keys.recent_jobs(), 0, -1)
    assert recent == job_ids[::-1][: scripts.RECENT_JOBS_KEPT]
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


@pytest.fixture(scope="module")
def console_cluster(make_module_cluster: ClusterFactory) -> Cluster:
    """Keys on, room for one job, two API processes: the page's requests land on either."""
    settings = {
        "TOKENRELAY_MAX_INFLIGHT": "1",
        "TOKENRELAY_API_KEYS": USER_KEY,
        "TOKENRELAY_ADMIN_API_KEYS": ADMIN_KEY,
    }
    return make_module_cluster(settings, api_workers=2)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` (.ci/run does)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


REPLY_LENGTH = """() => {
  const bodies = document.querySelectorAll('#conversation .msg.assistant .body');
  return bodies.length ? bodies[bodies.length - 1].textContent.length : -1;
}"""


@pytest.mark.e2e
def test_console_streams_a_reply_stops_it_and_shows_the_cluster(
    console_cluster: Cluster, browser: Browser
) -> None:
    expect.set_options(timeout=BROWSER_TIMEOUT_MS)
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    _open_with_key(page, console_cluster.base_url, ADMIN_KEY)
    expect(page.locator("#model")).to_have_value(MODEL_NAME)

    page.fill("#system", "You are a poet.")
    page.fill("#message", "Write a long poem about the sea.")
    page.fill("#temperature", "1")
    page.fill("#max-tokens", str(LONG_JOB_TOKENS))
    page.click("#advanced summary")
    page.fill("#min-tokens", str(LONG_JOB_TOKENS))
    page.click("#send")

    # the reply grows chunk by chunk while the job runs
    first = _reply_length_above(page, 0)
    second = _reply_length_above(page, first)
    assert second > first > 0
    expect(page.locator("#status")).to_have_text("streaming…")
    expect(page.locator("#ttft")).to_have_text(re.compile(r"^\d+ ms$"))
    job_id = page.locator("#job-id").inner_text()
    assert re.fullmatch(r"[0-9a-f]{32}", job_id)

    # the cluster view shows the running job: in flight, its worker busy with it, its row
    expect(page.locator("#inflight")).to_have_text("1")
    expect(page.locator("#max-inflight")).to_have_text("1")
    expect(page.locator(f'#recent-jobs tr[data-job-id="{job_id}"] td.status')).to_have_text(
        "running"
    )
    expect(page.locator("#workers tbody tr").first).to_contain_text(job_id[:8])
    view = httpx.get(f"{console_cluster.base_url}/v1/cluster", headers=bearer(ADMIN_KEY)).json()
    assert view["in_flight"] >= 1 and view["workers"][0]["running"] == [job_id]

    # another tab (its own session, so its own key) is refused in words a person can act on
    other = browser.new_page()
    _open_with_key(other, console_cluster.base_url, USER_KEY)
    expect(other.locator("#model")).to_have_value(MODEL_NAME)
    other.fill("#message", "hello?")
    other.click("#send")
    expect(other.locator("#notice")).to_contain_text("The cluster is at capacity")
    expect(other.locator("#notice")).to_contain_text("Try again in 1 second.")
    expect(other.locator("#cluster-notice")).to_contain_text("needs an admin API key")
    other.close()
    expect(page.locator("#rejections")).to_contain_text("cluster_overloaded: 1")
    page.screenshot(path=ARTIFACTS / "console-running.png")

    page.click("#stop")
    expect(page.locator("#status")).to_have_text("cancelled")
    expect(page.locator("#send")).to_be_enabled()
    record = httpx.get(
        f"{console_cluster.base_url}/v1/jobs/{job_id}", headers=bearer(ADMIN_KEY)
    ).json()
    assert record["status"] == "cancelled"
    assert record["error"]["type"] == "cancelled"
    expect(page.locator(f'#recent-jobs tr[data-job-id="{job_id}"] td.status')).to_have_text(
        "cancelled"
    )
    expect(page.locator("#inflight")).to_have_text("0")
    page.screenshot(path=ARTIFACTS / "console-stopped.png")
    page.close()


def _create_batch(client: openai.OpenAI, lines: list[str]) -> str:
    file_id = client.files.create(
        file=("in.jsonl", io.BytesIO("".join(line + "\n" for line in lines).encode())),
        purpose="batch",
    ).id
    return client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id


def _batch_line(custom_id: str) -> str:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return json.dumps(line)


@pytest.mark.e2e
def test_console_lists_the_keys_batches_with_counts_pages_and_files(
    console_cluster: Cluster, browser: Browser
) -> None:
    """A page of ten batches, newest first (ten that failed validation), then the older page
    with the one that ran: its counts and its output file, downloaded with the key; another
    key's batch is on neither."""
    expect.set_options(timeout=BROWSER_TIMEOUT_MS)
    base = f"{console_cluster.base_url}/v1"
    with (
        openai.OpenAI(base_url=base, api_key=USER_KEY, max_retries=0) as mine,
        openai.OpenAI(base_url=base, api_key=ADMIN_KEY, max_retries=0) as theirs,
    ):
        ran = _create_batch(mine, [_batch_line("a"), _batch_line("b")])
        eventually(
            lambda: mine.batches.retrieve(ran).status == "completed", 120, "the batch to run"
        )
        failed = [_create_batch(mine, ["{not json"]) for _ in range(10)]
        foreign = _create_batch(theirs, [_batch_line("x")])
        eventually(
            lambda: all(mine.batches.retrieve(b).status == "failed" for b in failed),
            60,
            "the bad batches to fail validation",
        )
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    _open_with_key(page, console_cluster.base_url, USER_KEY)
    rows = page.locator("#batch-list tbody tr")
    expect(rows).to_have_count(10)
    newest = page.locator(f'#batch-list tr[data-batch-id="{failed[-1]}"]')
    expect(newest.locator("td.status")).to_have_text("failed")
    expect(newest.locator("td.files")).to_have_text("\u2013")  # no files
    expect(page.locator(f'#batch-list tr[data-batch-id="{ran}"]')).to_have_count(0)
    expect(page.locator("#batches-newer")).to_be_disabled()

    page.click("#batches-older")
    expect(page.locator("#batches-page")).to_have_text("page 2")
    expect(rows).to_have_count(1)
    row = page.locator(f'#batch-list tr[data-batch-id="{ran}"]')
    expect(row.locator("td.status")).to_have_text("completed")
    expect(row).to_contain_text("/v1/chat/completions")
    expect(row.locator("td.count-total")).to_have_text("2")
    expect(row.locator("td.count-completed")).to_have_text("2")
    expect(row.locator("td.count-failed")).to_have_text("0")
    expect(row.locator("td.files a.errors")).to_have_count(0)
    expect(page.locator(f'#batch-list tr[data-batch-id="{foreign}"]')).to_have_count(0)
    expect(page.locator("#batches-older")).to_be_disabled()
    page.screenshot(path=ARTIFACTS / "console-batches.png")

    with page.expect_download() as download:
        row.locator("td.files a.output").click()
    saved = download.value
    assert saved.suggested_filename == f"{ran}_output.jsonl"
    output = [json.loads(line) for line in Path(saved.path()).read_text().splitlines()]
    assert [line["custom_id"] for line in output] == ["a", "b"]
    page.click("#batches-newer")
    expect(page.locator("#batches-page")).to_have_text("page 1")
    expect(rows).to_have_count(10)
    page.close()


def _open_with_key(page: Page, base_url: str, key: str) -> None:
    """Open the console; the gateway asks for a key, which the page keeps for this tab only."""
    page.goto(f"{base_url}/ui")
    expect(page.locator("#key-form")).to_be_visible()
    expect(page.locator("#notice")).to_contain_text("needs an API key")
    page.fill("#api-key", key)
    page.click("#key-form button")
    assert page.evaluate("sessionStorage.getItem('tokenrelay.apiKey')") == key


def _reply_length_above(page: Page, length: int) -> int:
    """Wait until the streamed reply is longer than `length`; return its length then."""
    page.wait_for_function(f"n => ({REPLY_LENGTH})() > n", arg=length, timeout=BROWSER_TIMEOUT_MS)
    result = page.evaluate(REPLY_LENGTH)
    assert isinstance(result, int)
    return result
