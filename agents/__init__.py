"""Agents: roles with tools (their own, and MCP servers') and capabilities, their tool loops and
structured answers, the blackboard they coordinate on, and peer messages between them."""

from ._agent import Agent, Bid, StructuredAsk, llm_bid
from ._board import Board, BoardStats
from ._board_model import (
    Answer,
    Answered,
    Awarded,
    BoardEvent,
    Claim,
    ClaimLostError,
    Helper,
    Offer,
    Post,
    Posted,
    PostFailed,
    PostFailedError,
    Released,
    Volunteer,
    award,
)
from ._board_store import BoardStore, MemoryBoardStore
from ._loop import AgentStopped, ConversationLog, LoopLimits, Prompt
from ._mail import (
    DEFAULT_TENANT,
    Address,
    Delivery,
    MailScopeError,
    MailStats,
    MessageId,
    MessageNotJSONError,
    MessageTooLargeError,
    PostOffice,
)
from ._mailstore import InProcessMailStore, MailStore
from ._mcp import MCPServerError, MCPTools, mcp_tools
from ._tools import TOOL_ERROR, Tool, ToolAction, ToolArgumentsError, ToolUse, tool

__all__ = [
    "TOOL_ERROR",
    "Agent",
    "AgentStopped",
    "Bid",
    "ConversationLog",
    "LoopLimits",
    "Prompt",
    "StructuredAsk",
    "Tool",
    "ToolAction",
    "ToolArgumentsError",
    "ToolUse",
    "llm_bid",
    "tool",
    # MCP servers as tools
    "MCPServerError",
    "MCPTools",
    "mcp_tools",
    # the blackboard
    "Answer",
    "Answered",
    "Awarded",
    "Board",
    "BoardEvent",
    "BoardStats",
    "BoardStore",
    "Claim",
    "ClaimLostError",
    "Helper",
    "MemoryBoardStore",
    "Offer",
    "Post",
    "PostFailed",
    "PostFailedError",
    "Posted",
    "Released",
    "Volunteer",
    "award",
    # peer messages
    "DEFAULT_TENANT",
    "Address",
    "Delivery",
    "InProcessMailStore",
    "MailScopeError",
    "MailStats",
    "MailStore",
    "MessageId",
    "MessageNotJSONError",
    "MessageTooLargeError",
    "PostOffice",
]
