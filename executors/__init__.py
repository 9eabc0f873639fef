"""Implementations of plait's protocols that do work: LLM backends and task runners.

- `FunctionLLM`: a function-driven fake LLM for tests and examples.
- `SimServer`: a simulated GPU serving engine (continuous batching, paged KV cache with
  prefix caching, priority queue, keep-alive pins) on the injected clock; `SimHTTP` serves
  it over an OpenAI-compatible API with vLLM's metrics (`plait sim serve`).
- `OpenAIBackend`: any OpenAI-compatible server, hints spelled in its dialect; its health
  (`check()`) and load (`load()`, a `LoadReport`) from the server's own endpoints.
- `ray_task`, `RayRunner`, `RayCluster`: function and tool tasks that run as Ray tasks on a
  cluster, with the resources they declare (Ray is imported only when they are used).
- `Router`: replicas of one model as one backend, routed by prompt prefix and load; the
  routers of several engines share what they place over a `RouterLink` (`LocalRouterHub`
  in one process); `LaneTuning` spells out its urgent lanes for experiments.
"""

from orchestrator.ext import LoadReport

from ._config import backends_from_config
from ._dialects import DIALECTS
from ._fake import FunctionLLM, RecordedCall, approx_tokens, echo
from ._grouping import GroupingStats, PrefixGrouper
from ._lanes import NO_LANES, LaneTuning
from ._openai import OpenAIBackend
from ._peerlink import NotifierRouterLink
from ._peers import LocalRouterHub, PeerStats, Placed, RouterLink, Served
from ._ray import RayCluster, RayError, RayRunner, RayWorkerLostError, ray_task
from ._router import ReplicaStats, Router
from ._routing import Choice, Placement, PrefixRouter
from ._sim import RequestTooLongError, SimServer, SimStats
from ._simhttp import Faults, SimHTTP
from ._simprofile import PROFILES, Profile, get_profile

__all__ = [
    "DIALECTS",
    "NO_LANES",
    "PROFILES",
    "Choice",
    "Faults",
    "FunctionLLM",
    "GroupingStats",
    "LaneTuning",
    "LoadReport",
    "LocalRouterHub",
    "NotifierRouterLink",
    "OpenAIBackend",
    "PeerStats",
    "Placed",
    "Placement",
    "PrefixGrouper",
    "PrefixRouter",
    "Profile",
    "RayCluster",
    "RayError",
    "RayRunner",
    "RayWorkerLostError",
    "RecordedCall",
    "ReplicaStats",
    "RequestTooLongError",
    "Router",
    "RouterLink",
    "Served",
    "SimHTTP",
    "SimServer",
    "SimStats",
    "approx_tokens",
    "backends_from_config",
    "echo",
    "get_profile",
    "ray_task",
]
