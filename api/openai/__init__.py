"""OpenAI's wire contract: request and response bodies, tools and tool calls, and which fields
are honoured, accepted with no effect, or refused."""
