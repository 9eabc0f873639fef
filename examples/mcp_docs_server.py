"""A small MCP server of team documents, for examples/mcp_agent.py: `search` finds documents
by words in their title or text, `read` returns one. Built with the official `mcp` SDK;
it speaks over stdio (`python mcp_docs_server.py`) or streamable HTTP (`python
mcp_docs_server.py http PORT`, at /mcp).
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

DOCS = {
    "on-call": "The on-call engineer answers pages within 15 minutes and hands over at 09:00.",
    "deploys": "Deploys run Tuesday to Thursday; a deploy needs one approval and green CI.",
    "incidents": "An incident gets a channel, a lead and a written review within five days.",
    "gpu-budget": "Each team has 400 GPU hours a week; batch jobs run at night.",
}

server = MCPServer("team-docs", version="1", log_level="WARNING")


@server.tool()
def search(query: str) -> list[str]:
    """Titles of the documents whose title or text has every word of the query."""
    words = query.lower().split()
    return [t for t, text in DOCS.items() if all(w in f"{t} {text}".lower() for w in words)]


@server.tool()
def read(title: str) -> str:
    """The text of one document, by its title (as search returns it)."""
    if title not in DOCS:
        raise ToolError(f"no document {title!r}; the titles are {', '.join(DOCS)}")
    return DOCS[title]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
