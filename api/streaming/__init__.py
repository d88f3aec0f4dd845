"""The API half of the per-token path (HOT PATH): the pub/sub listener, the fan-out hub with
replay, a job's event iterator, the relay to a client's bytes and SSE framing."""
