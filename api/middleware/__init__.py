"""Pure ASGI middleware, one per file: the body size limit, request ids, the request log."""
