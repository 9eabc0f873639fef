"""`plait serve`: the REST service. Submit and follow workflows over HTTP (docs/rest.md).

The service runs one durable engine; a workflow spec names agents, tools and functions
that the service's registry holds, never code.
"""

from ._app import Service
from ._build import SpecError
from ._config import ServeConfig, Tenant, hash_token, load_registry, load_serve_config
from ._openapi import openapi
from ._spec import AddTasks, SingleTask, TaskSpec, WorkflowSpec

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
