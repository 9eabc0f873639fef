"""Agents: roles with tools and capabilities, their tool loops and structured answers."""

from ._agent import Agent, Bid, StructuredAsk
from ._loop import AgentStopped, ConversationLog, Limits, Prompt
from ._tools import TOOL_ERROR, Tool, ToolAction, ToolArgumentsError, ToolUse, tool

__all__ = [
    "TOOL_ERROR",
    "Agent",
    "AgentStopped",
    "Bid",
    "ConversationLog",
    "Limits",
    "Prompt",
    "StructuredAsk",
    "Tool",
    "ToolAction",
    "ToolArgumentsError",
    "ToolUse",
    "tool",
]
