"""`plait serve`: the REST service. Submit and follow workflows over HTTP (docs/rest.md).

The service runs one durable engine; a workflow spec names agents, tools and functions
that the service's registry holds, never code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._build import SpecError
from ._config import ServeConfig, Tenant, hash_token, load_registry, load_serve_config
from ._openapi import openapi
from ._spec import AddTasks, SingleTask, TaskSpec, WorkflowSpec

if TYPE_CHECKING:
    from ._app import Service

__all__ = [
    "AddTasks",
    "ServeConfig",
    "Service",
    "SingleTask",
    "SpecError",
    "TaskSpec",
    "Tenant",
    "WorkflowSpec",
    "hash_token",
    "load_registry",
    "load_serve_config",
    "openapi",
]


def __getattr__(name: str) -> Any:
    # The HTTP server (aiohttp.web) is imported when it is asked for, not with the package:
    # `orchestrator.client` reads this package's request and answer models without it.
    if name == "Service":
        from ._app import Service

        return Service
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
