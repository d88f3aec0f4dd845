"""The console in a real browser (Debian's Chromium, driven by playwright) against real
API and worker processes."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from playwright.sync_api import Browser, Page, Route, expect, sync_playwright

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.testing.polling import eventually

SECRET = "the secret prompt 🌊 nobody else may read"
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
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LONG_JOB_TOKENS = 1800  # many seconds on the tiny model (2048 positions); the test stops it
BROWSER_TIMEOUT_MS = 30_000


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


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
    # one tokens/s figure: the playground shows its job's, as the cluster view reports it
    row_tps = page.locator(f'#recent-jobs tr[data-job-id="{job_id}"] td.tps')
    expect(row_tps).to_have_text(re.compile(r"^\d+\.\d$"))
    expect(page.locator("#tps")).to_have_text(row_tps.inner_text())
    expect(page.locator("#queues tbody tr")).to_have_count(3)  # high, normal, low
    expect(page.locator("#queues tbody tr").first).to_contain_text(":high")
    expect(page.locator("#inflight")).to_have_text("0")
    page.screenshot(path=ARTIFACTS / "console-stopped.png")
    page.close()


@pytest.mark.parametrize(
    ("path", "title"),
    [("/docs", ".swagger-ui .info .title"), ("/redoc", "h1")],
)
def test_the_api_reference_pages_render_with_nothing_from_outside(
    console_cluster: Cluster, browser: Browser, path: str, title: str
) -> None:
    """Swagger UI and ReDoc draw the schema with every request answered by the gateway: any
    other host is refused, as on a machine without a network."""
    expect.set_options(timeout=BROWSER_TIMEOUT_MS)
    elsewhere: list[str] = []

    def only_the_gateway(route: Route) -> None:
        if route.request.url.startswith(console_cluster.base_url):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.route("**/*", only_the_gateway)
    page.goto(f"{console_cluster.base_url}{path}")
    expect(page.locator(title).first).to_contain_text("tokenrelay")
    expect(page.get_by_text("/v1/chat/completions").first).to_be_visible()
    assert elsewhere == []
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
