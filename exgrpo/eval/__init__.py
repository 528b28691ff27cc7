"""Evaluation for the paper's protocol (docs/algorithm.md §12): generation backends (vLLM, Hugging Face), grading with
the reward's checker, avg@k / pass@k metrics, and paper-style tables, JSON/CSV results and charts.

Command line: ``python -m exgrpo.eval {run,generate,score,report} ...`` (see ``exgrpo.eval.cli``).
Importing this package loads neither torch, transformers nor vllm; backends import them when built.
"""

from exgrpo.eval.metrics import (
    ID_BENCHMARKS,
    OOD_BENCHMARKS,
    PAPER_COLUMNS,
    BenchmarkMetrics,
    avg_at_k,
    compute_benchmark_metrics,
    macro_average,
    macro_averages,
    pass_at_k,
)
from exgrpo.eval.report import (
    REFERENCE_TABLES,
    EvalResults,
    load_results,
    render_markdown,
    save_results,
    write_report,
)

__all__ = [
    "ID_BENCHMARKS",
    "OOD_BENCHMARKS",
    "PAPER_COLUMNS",
    "REFERENCE_TABLES",
    "BenchmarkMetrics",
    "EvalResults",
    "avg_at_k",
    "compute_benchmark_metrics",
    "load_results",
    "macro_average",
    "macro_averages",
    "pass_at_k",
    "render_markdown",
    "save_results",
    "write_report",
]
