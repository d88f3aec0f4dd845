"""Webhooks: where they may go, the reliable delivery queue, and the dispatcher that signs and
sends them."""
