"""An MCP server for the tests, built with the official SDK: `python mcp_server.py stdio` or
`python mcp_server.py http PORT`.

Its tools: `echo` (text back; with MCP_TEST_VARIANT=wider it takes a second, required
argument, so its schema changes), `add` (structured output), `fail` (an error result),
`refuse` (a JSON-RPC error), `big` (a long answer), `files.read` (a dotted name), `die`
(the process exits mid-call) and `slow`. Each call is appended to the file named by
MCP_TEST_LOG, if set, so a test can count what the server was asked.
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp import MCPError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

server = MCPServer("plait-test", version="1", log_level="WARNING")
WIDER = os.environ.get("MCP_TEST_VARIANT") == "wider"


def note(line: str) -> None:
    path = os.environ.get("MCP_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(line + "\n")


if WIDER:

    @server.tool()
    def echo(text: str, times: int) -> str:
        """Say the text back, this many times."""
        note(f"echo {text}")
        return text * times

else:

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        note(f"echo {text}")
        return text


class Sum(BaseModel):
    total: int
    count: int


@server.tool()
def add(numbers: list[int]) -> Sum:
    """Add numbers up."""
    note("add")
    return Sum(total=sum(numbers), count=len(numbers))


@server.tool()
def fail(why: str) -> str:
    """Always answers with an error."""
    note("fail")
    raise ToolError(f"cannot: {why}")


@server.tool()
def refuse(path: str) -> str:
    """Answers with a JSON-RPC error (invalid params), as a server that checks its input."""
    note("refuse")
    raise MCPError(code=-32602, message=f"invalid params: no such path {path!r}")


@server.tool()
def big(chars: int) -> str:
    """Answers with this many characters."""
    return "x" * chars


@server.tool(name="files.read")
def files_read(path: str) -> str:
    """A tool whose name has a dot, as the protocol allows."""
    return f"read {path}"


@server.tool()
def die() -> str:
    """The server's process exits during the call."""
    note("die")
    os._exit(3)


@server.tool()
async def slow(seconds: float) -> str:
    """Answers after a while."""
    await anyio.sleep(seconds)
    return "late"


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
