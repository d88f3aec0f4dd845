"""OpenAI's Files API, for batch input and output: upload, list, look up, download, delete."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import StreamingResponse

from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.error_docs import FILE_ERRORS, UPLOAD_ERRORS
from tokenrelay.api.files import store as file_store
from tokenrelay.api.files.store import FileDeleted, FileList, FileObject
from tokenrelay.api.files.upload import receive_upload

#: The multipart framing around the file itself (boundaries, part headers, `purpose`).
MULTIPART_OVERHEAD_BYTES = 64 * 1024

_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
}

router = APIRouter(prefix="/v1/files", tags=["files"], responses=FILE_ERRORS)


@router.post(
    "",
    openapi_extra=_UPLOAD_BODY,
    responses=UPLOAD_ERRORS,
)
async def upload_file(http: Request, state: StateDep, caller: CallerDep) -> FileObject:
    """Upload a JSONL file of batch requests (`purpose=batch`), stored as it streams in."""
    content_type = http.headers.get("content-type")
    return await receive_upload(state, caller.owner, content_type, http.stream())


@router.get("")
async def list_files(
    state: StateDep,
    caller: CallerDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> FileList:
    """The caller's files, newest first (`order=asc` for oldest), paged by `after`/`limit`."""
    return await file_store.list_files(
        state.redis, caller, after=after, limit=limit, order=order, purpose=purpose
    )


@router.get("/{file_id}")
async def retrieve_file(file_id: str, state: StateDep, caller: CallerDep) -> FileObject:
    return await file_store.get_file(state.redis, caller, file_id)


@router.get(
    "/{file_id}/content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def file_content(file_id: str, state: StateDep, caller: CallerDep) -> StreamingResponse:
    """The file's bytes, streamed from Redis chunk by chunk."""
    item = await file_store.get_file(state.redis, caller, file_id)
    return StreamingResponse(
        file_store.iter_content(state, file_id),
        media_type="application/octet-stream",
        headers={"Content-Length": str(item.bytes)},
    )


@router.delete("/{file_id}")
async def delete_file(file_id: str, state: StateDep, caller: CallerDep) -> FileDeleted:
    return await file_store.delete_file(state.redis, caller, file_id)
