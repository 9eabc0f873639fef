"""Agents and their tools. The blackboard and peer messages come in a later issue."""

from ._agent import Agent, Prompt
from ._tools import Tool, ToolAction

__all__ = ["Agent", "Prompt", "Tool", "ToolAction"]
