"""The engines behind the `Engine` protocol (transformers, vLLM, synthetic) and everything that
imports torch, transformers, vLLM or xgrammar."""
