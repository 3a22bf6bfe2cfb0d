"""Workflows and traces: the DAG model, the trace schemas (``topas.trace/1``; ``topas.trace/2`` adds
the prompts' segments) with their validation, Poisson arrivals, the paper's synthetic workloads and
what a perfect prefix cache reuses in a trace (:mod:`topas.workload.reuse`).

Quick start::

    from topas.workload import read_trace, retime
    trace = retime(read_trace("data/traces/dag-4.json.gz"), rate=0.2, seed=1)
"""

from topas.workload.arrivals import poisson_arrivals, retime
from topas.workload.critical_path import longest_path_from, longest_remaining_path
from topas.workload.model import Agent, Segment, Stage, Task, Trace
from topas.workload.synthetic import SYNTHETIC, chain3, dag4, dag10_wide
from topas.workload.trace_io import read_trace, request_id, trace_from_dict, trace_to_dict, write_trace
from topas.workload.validate import SUPPORTED_SCHEMAS, TraceError, validate_dict, validate_trace

__all__ = [
    "Agent",
    "Segment",
    "Stage",
    "Task",
    "Trace",
    "TraceError",
    "SUPPORTED_SCHEMAS",
    "SYNTHETIC",
    "chain3",
    "dag4",
    "dag10_wide",
    "longest_path_from",
    "longest_remaining_path",
    "poisson_arrivals",
    "read_trace",
    "request_id",
    "retime",
    "trace_from_dict",
    "trace_to_dict",
    "validate_dict",
    "validate_trace",
    "write_trace",
]
