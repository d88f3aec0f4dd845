"""The pages a person opens in a browser: `GET /`, and the API's reference at `/docs` (Swagger
UI) and `/redoc` (ReDoc), which work without a network.

FastAPI's own reference pages load their JavaScript and CSS from a CDN (ReDoc also its fonts
from Google), so offline they stay blank. These are the same pages (`get_swagger_ui_html`,
`get_redoc_html`) pointed at `/docs/assets/`, which serves the files that the
`fastapi-offline` distribution ships (Swagger UI, Apache-2.0; ReDoc, MIT). They are read
where pip put them (`importlib.metadata`); that distribution's Python code is never imported.
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from tokenrelay.api.deps import StateDep
from tokenrelay.shared.errors import NotFound
from tokenrelay.shared.version import VERSION

ASSETS_DISTRIBUTION = "fastapi-offline"
ASSETS_FOLDER = "fastapi_offline/static"
ASSETS = frozenset({"swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"})
_ASSET_HEADERS = {"Cache-Control": "public, max-age=86400"}
PAGE_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; "
    "frame-ancestors 'none'"
)
"""The pages' Content-Security-Policy: the browser fetches nothing from another host. ReDoc
draws a "powered by" logo from its vendor's CDN whatever its options; refused here, it is
left out (its image hides itself when it fails to load)."""
TITLE = "tokenrelay API"

index_router = APIRouter(include_in_schema=False)
docs_router = APIRouter(include_in_schema=False)


@index_router.get("/", response_model=None)
async def index(state: StateDep) -> RedirectResponse | dict[str, object]:
    """The console where it is on; else where to go from here."""
    settings = state.settings
    if settings.console_enabled:
        return RedirectResponse("ui/", status_code=307)
    links = {"models": "/v1/models", "health": "/healthz", "metrics": "/metrics"}
    if settings.docs_enabled:
        links |= {"docs": "/docs", "redoc": "/redoc", "openapi": "/openapi.json"}
    return {"service": "tokenrelay", "version": VERSION, "links": links}


@docs_router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    page = get_swagger_ui_html(
        openapi_url=f"{root}/openapi.json",
        title=TITLE,
        swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
        swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
        swagger_favicon_url=f"{root}/docs/assets/favicon.png",
        # Swagger UI would otherwise show a badge fetched from validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )
    return _confined(page)


@docs_router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    page = get_redoc_html(
        openapi_url=f"{root}/openapi.json",
        title=TITLE,
        redoc_js_url=f"{root}/docs/assets/redoc.standalone.js",
        redoc_favicon_url=f"{root}/docs/assets/favicon.png",
        with_google_fonts=False,
    )
    return _confined(page)


def _confined(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = PAGE_POLICY
    return page


@docs_router.get("/docs/assets/{name}")
async def asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise NotFound(f"no docs asset {name!r}")
    return FileResponse(assets_dir() / name, headers=_ASSET_HEADERS)


@functools.cache
def assets_dir() -> Path:
    """Where pip installed the Swagger UI and ReDoc files."""
    try:
        found = distribution(ASSETS_DISTRIBUTION).locate_file(ASSETS_FOLDER)
    except PackageNotFoundError as exc:
        raise NotFound(
            f"the docs pages' files are not installed (pip install {ASSETS_DISTRIBUTION}, "
            "part of tokenrelay[api])"
        ) from exc
    return Path(str(found))


def _root(request: Request) -> str:
    """The path prefix the app is served under (uvicorn's `--root-path`), "" for none."""
    return str(request.scope.get("root_path", "")).rstrip("/")
