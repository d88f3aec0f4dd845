"""`x-request-id` on every response: the client's own when it sent a usable one, else a
new one, so the OpenAI SDKs' `request_id` (and a support ticket) names the request.

Pure ASGI, outermost, so errors answered by other middleware carry it too; the id is also
in the request's log line (`request_log`).
"""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
#: A client's id is echoed when it is short and plain (no header injection, bounded logs).
_USABLE = re.compile(rb"[A-Za-z0-9._:/+=-]{1,128}")


def request_id(scope: Scope) -> str:
    """The id `RequestId` gave this request."""
    return str(scope.get("state", {}).get("request_id", ""))


class RequestId:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope["headers"]).get(HEADER)
        value = sent if sent is not None and _USABLE.fullmatch(sent) else uuid.uuid4().hex.encode()
        scope.setdefault("state", {})["request_id"] = value.decode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, value)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
