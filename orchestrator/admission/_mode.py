"""Admission modes: what the engine does about deadlines and load, chosen with one word."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..model._errors import UsageError
from ._gate import DEFAULT_GATE, DeadlineGate
from ._knee import DEFAULT_HEADROOM, Headroom
from ._scheduler import POLICIES, Policy, get_policy

Mode = Literal["deadlines", "throughput", "off"]
"""`Engine(admission=...)`, `[engine] admission` (docs/admission.md):

- `deadlines` (the default): runs with a deadline least slack first, the others after them
  in arrival order; slack-rich work held back to each backend's learned throughput knee
  while urgent work is around; runs with a deadline started through the deadline gate;
- `throughput`: runs in arrival order (interactive first), nothing held back for urgent
  work, no gate;
- `off`: as `throughput`, and no hold-back for the server's KV cache either: the engine
  adds nothing to the limits it is given."""


@dataclass(frozen=True, slots=True)
class AdmissionTuning:
    """Admission spelled out, for benchmarks and experts (`Engine(admission=...)`); the
    defaults are the `deadlines` mode.

    `order`: how programs are ranked (`fcfs`, `las`, `slack`, or an
    `orchestrator.ext.Policy`). `headroom`: the learned knee hold-back (None: nothing held
    back but a fixed `Limits.batch_in_flight`). `gate`: the deadline gate (None: off).
    `default_estimate`: a task's seconds until one of its kind has finished (what the
    `slack` order and hopeless runs are judged by). `hold_back`: derive a backend's KV
    hold-back budget from what its server says (False: only a `Limits.kv_tokens` given)."""

    order: str | Policy = "slack"
    headroom: Headroom | None = DEFAULT_HEADROOM
    gate: DeadlineGate | None = DEFAULT_GATE
    default_estimate: float = 1.0
    hold_back: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.order, str) and self.order not in POLICIES:
            raise UsageError(
                f"AdmissionTuning(order={self.order!r}): choose one of {', '.join(POLICIES)} "
                "or pass an orchestrator.ext.Policy"
            )
        if self.headroom is not None and not isinstance(self.headroom, Headroom):
            raise UsageError(
                f"AdmissionTuning(headroom=...) takes a Headroom or None, got {self.headroom!r}"
            )
        if self.gate is not None and not isinstance(self.gate, DeadlineGate):
            raise UsageError(
                f"AdmissionTuning(gate=...) takes a DeadlineGate or None, got {self.gate!r}"
            )
        estimate = self.default_estimate
        if isinstance(estimate, bool) or not isinstance(estimate, int | float):
            raise UsageError(f"AdmissionTuning(default_estimate={estimate!r}) takes seconds")
        if not (math.isfinite(estimate) and estimate > 0):
            raise UsageError(
                f"AdmissionTuning(default_estimate={estimate!r}) must be a positive number "
                "of seconds"
            )

    @property
    def policy(self) -> Policy:
        """The order as a policy object."""
        return get_policy(self.order)


MODES: Mapping[str, AdmissionTuning] = {
    "deadlines": AdmissionTuning(),
    "throughput": AdmissionTuning(order="fcfs", headroom=None, gate=None),
    "off": AdmissionTuning(order="fcfs", headroom=None, gate=None, hold_back=False),
}


SAYS: Mapping[str, str] = {
    "deadlines": "runs with a deadline least slack first, the others after them in arrival "
    "order; slack-rich work held back at each backend's learned throughput knee while urgent "
    "work is around; runs with a deadline started through the deadline gate",
    "throughput": "runs in arrival order (interactive first); nothing held back for urgent "
    "work; no deadline gate",
    "off": "runs in arrival order (interactive first); nothing held back, not even for a "
    "server's KV cache: only the limits given",
}
"""What each mode does, in a line (`plait config check`)."""


def admission_tuning(admission: str | AdmissionTuning) -> AdmissionTuning:
    """The tuning an `Engine(admission=...)` value stands for."""
    if isinstance(admission, AdmissionTuning):
        return admission
    if isinstance(admission, str) and admission in MODES:
        return MODES[admission]
    raise UsageError(
        f"Engine(admission={admission!r}): choose one of {', '.join(MODES)} "
        "(docs/admission.md), or an orchestrator.ext.AdmissionTuning"
    )
