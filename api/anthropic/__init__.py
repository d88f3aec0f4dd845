"""Anthropic's Messages API (`/v1/messages`): its wire shapes, errors and SSE events, over the
one admission → queue → worker → event log → relay path."""
