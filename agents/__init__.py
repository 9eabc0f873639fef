"""Agents, their tools, and peer messages between them. The blackboard comes in a later
issue."""

from ._agent import Agent, Prompt
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
from ._tools import Tool, ToolAction

__all__ = [
    "Agent",
    "Prompt",
    "Tool",
    "ToolAction",
    # peer messages (issue 10)
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
