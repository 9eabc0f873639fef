"""Implementations of plait's protocols that do work: LLM backends and task runners.

For now: a function-driven fake LLM for tests and examples. The simulated GPU server and
the OpenAI-compatible client with per-server dialects come next.
"""

from ._fake import FunctionLLM, RecordedCall, approx_tokens, echo

__all__ = ["FunctionLLM", "RecordedCall", "approx_tokens", "echo"]
