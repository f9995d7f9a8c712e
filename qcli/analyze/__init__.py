"""Prove a quantized model with numbers: accuracy (or fidelity to the float model), per-layer
error, latency, size and quality gates, as one `Report` written to JSON, Markdown or HTML.

    report = analyze("model.onnx", "model.int8.onnx", "eval/", AnalyzeOptions(runs=20),
                     gates=Gates(min_speedup=1.1))
    write_report(report, Path("report.html")); render(console, report)
    if (error := report.gate_error()): raise error   # GateFailed: exit code 1
"""

from qcli.analyze.core import analyze, evaluate, open_data, sample_count
from qcli.analyze.gates import Gates
from qcli.analyze.options import AnalyzeOptions
from qcli.analyze.report import FORMAT, Report, read_report
from qcli.analyze.summary import headline
from qcli.analyze.terminal import render
from qcli.analyze.write import FORMATS, report_text, write_report

__all__ = [
    "FORMAT", "FORMATS", "AnalyzeOptions", "Gates", "Report", "analyze", "evaluate", "headline", "open_data",
    "read_report", "render", "report_text", "sample_count", "write_report",
]
