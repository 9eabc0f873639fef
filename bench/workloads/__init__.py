"""Seeded generators of the LLM workloads that real agent systems produce.

A workload is a list of `Program`s: one job each (an agent solving an issue, a text-to-SQL
query, a batch of document questions), arriving at a time on the clock, made of steps that
depend on each other. LLM steps build their messages from the replies of earlier steps,
so conversations grow turn by turn exactly as they would against a real server; tool steps
are pauses. The same seed gives the same workload, bit for bit.
"""

from ._program import LLMStep, Program, Step, ToolStep, TraceStep, poisson_arrivals
from .agents import agent_programs, many_agent_programs
from .batch import batch_programs, batch_rows
from .mooncake import mooncake_programs
from .sql import sql_programs

__all__ = [
    "LLMStep",
    "Program",
    "Step",
    "ToolStep",
    "TraceStep",
    "agent_programs",
    "batch_programs",
    "batch_rows",
    "many_agent_programs",
    "mooncake_programs",
    "poisson_arrivals",
    "sql_programs",
]
