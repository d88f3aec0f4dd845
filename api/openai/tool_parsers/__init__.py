"""The tool-call parsers, one format each; `api.openai.tool_calls` chooses one by name."""
