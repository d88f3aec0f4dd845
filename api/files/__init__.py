"""OpenAI's Files API over Redis: uploads streamed in chunk by chunk, owner-checked records."""
