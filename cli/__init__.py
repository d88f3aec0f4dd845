"""The composition root: the `tokenrelay` command, its HTTP client, the embedded Redis and
the process harness. The only layer that may import both the API and the worker."""
