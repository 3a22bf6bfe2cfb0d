"""Workflows and traces: the DAG model, the trace schema (``topas.trace/1``) with its validation,
Poisson arrivals and the paper's synthetic workloads.

Quick start::

    from topas.workload import read_trace, retime
    trace = retime(read_trace("data/traces/dag-4.json.gz"), rate=0.2, seed=1)
"""

from topas.workload.arrivals import poisson_arrivals, retime
from topas.workload.critical_path import longest_path_from, longest_remaining_path
from topas.workload.model import Agent, Stage, Task, Trace
from topas.workload.synthetic import SYNTHETIC, chain3, dag4, dag10_wide
from topas.workload.trace_io import read_trace, request_id, trace_from_dict, trace_to_dict, write_trace
from topas.workload.validate import SUPPORTED_SCHEMAS, TraceError, validate_dict, validate_trace

__all__ = [
    "Agent",
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
