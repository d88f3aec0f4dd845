"""OpenAI's Responses API: a dialect over the one admission → queue → worker → event log →
relay path, with responses stored in Redis under their API key's owner."""
