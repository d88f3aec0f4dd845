"""`/ui`: the web console (playground and live cluster view), static files from `api/static`.

Plain HTML, CSS and JavaScript shipped in the package: no build step, no CDN. The page
talks to the public API (`/v1/models`, `/v1/chat/completions`, `/v1/jobs`, `/v1/cluster`,
`/v1/batches`, `/v1/files/{id}/content`).
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from tokenrelay.shared.errors import NotFound

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
_NAME = re.compile(r"^[a-z0-9-]+\.(html|css|js|png)$")
_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
}

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("")
async def console_root() -> RedirectResponse:
    return RedirectResponse("ui/", status_code=308)


@router.get("/")
async def console_page() -> FileResponse:
    return await console_file("index.html")


@router.get("/{name}")
async def console_file(name: str) -> FileResponse:
    path = STATIC_DIR / name
    if not _NAME.match(name) or not path.is_file():
        raise NotFound(f"no console file {name!r}")
    return FileResponse(path, headers=_HEADERS)
