"""The pages a browser opens: `GET /`, and `/docs` and `/redoc` with every file they load served
by the gateway itself (no CDN: many clusters, and these machines, have no internet)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tokenrelay.api.app import create_app
from tokenrelay.shared.settings import Settings

EXTERNAL_HOST = re.compile(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", re.IGNORECASE)
# What a page loads: <link href>, <script src>, <redoc spec-url>, Swagger UI's `url:`.
LOADED = re.compile(r"""(?:href|src|spec-url)="([^"]*)"|\burl: '([^']*)'""")
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


def client_for(redis_url: str, **settings: bool) -> TestClient:
    return TestClient(create_app(Settings(redis_url=redis_url, **settings)))


@pytest.fixture
def client(redis_url: str) -> Iterator[TestClient]:
    with client_for(redis_url) as test_client:
        yield test_client


def loaded_paths(html: str) -> list[str]:
    return [href or url for href, url in LOADED.findall(html)]


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("/docs", {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png", "openapi.json"}),
        ("/redoc", {"redoc.standalone.js", "favicon.png", "openapi.json"}),
    ],
)
def test_the_reference_pages_load_every_file_from_the_gateway(
    client: TestClient, page: str, expected: set[str]
) -> None:
    response = client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert not EXTERNAL_HOST.search(response.text), response.text
    policy = response.headers["content-security-policy"]  # nor anything the scripts ask for
    assert "default-src 'self'" in policy and not EXTERNAL_HOST.search(policy)
    loaded = loaded_paths(response.text)
    assert {path.rsplit("/", 1)[-1] for path in loaded} == expected
    for path in loaded:
        assert path.startswith("/"), path
        asset = client.get(path)
        assert asset.status_code == 200, path
        suffix = path[path.rfind(".") :]
        wanted = CONTENT_TYPES.get(suffix, "application/json")
        assert asset.headers["content-type"].startswith(wanted), path
        assert len(asset.content) > 1000, path


def test_only_the_reference_pages_files_are_served_from_the_assets_folder(
    client: TestClient,
) -> None:
    for name in ("core.py", "..%2F__init__.py", "nope.js"):
        response = client.get(f"/docs/assets/{name}")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_the_root_redirects_to_the_console(client: TestClient) -> None:
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 307
    assert response.headers["location"] == "ui/"
    assert client.get("/").url.path == "/ui/"


def test_without_the_console_the_root_lists_where_to_go(redis_url: str) -> None:
    with client_for(redis_url, console_enabled=False) as test_client:
        response = test_client.get("/")
        assert response.status_code == 200
        links = response.json()["links"]
        assert links["docs"] == "/docs" and links["models"] == "/v1/models"
        for path in links.values():
            assert test_client.get(path).status_code == 200, path


def test_without_docs_the_reference_pages_and_their_files_are_gone(redis_url: str) -> None:
    with client_for(redis_url, docs_enabled=False, console_enabled=False) as test_client:
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/assets/swagger-ui.css"):
            assert test_client.get(path).status_code == 404, path
        assert "docs" not in test_client.get("/").json()["links"]
