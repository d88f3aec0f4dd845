"""`POST /v1/files`' body, parsed as it streams in (python-multipart's push parser): the
`file` part goes to Redis chunk by chunk as it arrives, so an upload of any size costs the
API one chunk of memory; `purpose` is a small text part. Limits are checked as the bytes
come, so an oversized upload is refused once it crosses the limit, not after it is stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from tokenrelay.api.files.store import FileObject, FileWriter
from tokenrelay.api.state import AppState
from tokenrelay.shared.errors import InvalidRequest, PayloadTooLarge

MAX_TEXT_FIELD_BYTES = 64
FIELDS = ("file", "purpose")


@dataclass
class _Part:
    name: str = ""
    filename: str | None = None
    header_field: bytearray = field(default_factory=bytearray)
    header_value: bytearray = field(default_factory=bytearray)


@dataclass
class _Form:
    """What the parser's callbacks collect: the parts seen, the file data not yet stored."""

    part: _Part = field(default_factory=_Part)
    file_data: list[bytes] = field(default_factory=list)
    filename: str | None = None
    purpose: bytearray = field(default_factory=bytearray)
    seen: set[str] = field(default_factory=set)
    error: InvalidRequest | None = None

    def on_part_begin(self) -> None:
        self.part = _Part()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.part.header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.part.header_value += data[start:end]

    def on_header_end(self) -> None:
        if bytes(self.part.header_field).lower() == b"content-disposition":
            _, options = parse_options_header(bytes(self.part.header_value))
            self.part.name = options.get(b"name", b"").decode("utf-8", "replace")
            raw_filename = options.get(b"filename")
            if raw_filename is not None:
                self.part.filename = raw_filename.decode("utf-8", "replace")
        self.part.header_field.clear()
        self.part.header_value.clear()

    def on_headers_finished(self) -> None:
        name = self.part.name
        if name not in FIELDS:
            self._fail(f"unknown form field {name[:40]!r}: only `file` and `purpose`", name)
        elif name in self.seen:
            self._fail(f"the form field `{name}` is given twice", name)
        self.seen.add(name)
        if name == "file":
            self.filename = self.part.filename or "upload.jsonl"

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.error is not None:
            return
        if self.part.name == "file":
            self.file_data.append(bytes(data[start:end]))
        elif self.part.name == "purpose":
            self.purpose += data[start:end]
            if len(self.purpose) > MAX_TEXT_FIELD_BYTES:
                self._fail("`purpose` must be `batch`", "purpose")

    def _fail(self, message: str, param: str) -> None:
        if self.error is None:
            self.error = InvalidRequest(message, param=param or None)


def _boundary(content_type: str | None) -> bytes:
    kind, options = parse_options_header(content_type or "")
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise InvalidRequest(
            "upload a file as multipart/form-data with the fields `file` and `purpose`",
            param="file",
        )
    return boundary


async def receive_upload(
    state: AppState, owner: str, content_type: str | None, body: AsyncIterator[bytes]
) -> FileObject:
    """Parse and store the upload; raises `InvalidRequest` (400) for a bad form or too many
    lines and `PayloadTooLarge` (413) past the byte limit, keeping nothing."""
    settings = state.settings
    form = _Form()
    parser = MultipartParser(
        _boundary(content_type),
        callbacks={  # type: ignore[arg-type]
            "on_part_begin": form.on_part_begin,
            "on_header_field": form.on_header_field,
            "on_header_value": form.on_header_value,
            "on_header_end": form.on_header_end,
            "on_headers_finished": form.on_headers_finished,
            "on_part_data": form.on_part_data,
        },
    )
    writer = FileWriter(state)
    try:
        async for data in body:
            try:
                parser.write(data)
            except MultipartParseError as exc:
                raise InvalidRequest(f"malformed multipart body: {exc}", param="file") from exc
            if form.error is not None:
                raise form.error
            for piece in form.file_data:
                await writer.write(piece)
            form.file_data.clear()
            _check_limits(writer, settings.file_max_bytes, settings.file_max_requests)
        try:
            parser.finalize()
        except MultipartParseError as exc:
            raise InvalidRequest(f"malformed multipart body: {exc}", param="file") from exc
        return await _commit(state, owner, form, writer)
    except BaseException:
        await writer.discard()
        raise


def _check_limits(writer: FileWriter, max_bytes: int, max_requests: int) -> None:
    if writer.size > max_bytes:
        raise PayloadTooLarge(
            f"the file exceeds the limit of {max_bytes} bytes (TOKENRELAY_FILE_MAX_BYTES)"
        )
    if writer.line_count > max_requests:
        raise InvalidRequest(
            f"the file has more than {max_requests} lines, the limit of requests per batch "
            "file (TOKENRELAY_FILE_MAX_REQUESTS)",
            param="file",
        )


async def _commit(state: AppState, owner: str, form: _Form, writer: FileWriter) -> FileObject:
    if form.filename is None:
        raise InvalidRequest("the form has no `file` part", param="file")
    purpose = form.purpose.decode("utf-8", "replace")
    if purpose != "batch":
        raise InvalidRequest(f"`purpose` must be `batch`, got {purpose[:40]!r}", param="purpose")
    if writer.size == 0:
        raise InvalidRequest("the file is empty", param="file")
    return await writer.commit(owner, form.filename, "batch", state.settings.file_retention_s)
