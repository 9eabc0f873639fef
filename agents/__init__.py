"""Agents, their tools, and the blackboard they coordinate on. Peer messages come later."""

from ._agent import Agent, Prompt
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
from ._tools import Tool, ToolAction

__all__ = [
    "Agent",
    "Prompt",
    "Tool",
    "ToolAction",
    # the blackboard (issue 10)
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
]
