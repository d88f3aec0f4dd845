"""Test support that is not a fixture: real clusters of tokenrelay processes, a webhook
receiver, batch helpers."""
