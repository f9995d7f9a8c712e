"""qcli from Python: the sample CNN calibrated, quantized, verified and analyzed, as the CLI does.

Run from the repository root: `python docs/examples/python_api.py [OUT_DIR]` (default out/).
tests/test_docs.py runs it.
"""

import sys
from pathlib import Path

from qcli.analyze import AnalyzeOptions, Gates, analyze, write_report
from qcli.commands import quantize_command
from qcli.config import load_config
from qcli.errors import QcliError
from qcli.flags import CalibrationFlags, QuantizeFlags
from qcli.model import load_model, save_model
from qcli.verify import quantize_checked

CNN = Path("sample_models/cnn")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)

    # 1. The command as a library call: `qcli quantize MODEL -o OUT --data DIR --json`.
    run = quantize_command(QuantizeFlags(CNN / "model.onnx", out / "cnn.int8.onnx", data=CNN / "calib",
                                         calibration=CalibrationFlags(config="default", samples=128)))
    print("compression", run.doc["compression"], "verified:", run.doc["verification"]["passed"])
    if (error := run.gate_error()) is not None:  # a missed floor: the CLI's exit code 1
        raise error

    # 2. The stages: a config, calibration + quantization + verification, then the model written.
    config = load_config("default").merged(calibration={"samples": 128})
    outcome = quantize_checked(load_model(CNN / "model.onnx"), config, data=CNN / "calib",
                               eval_data=CNN / "eval")
    assert outcome.verification is not None and outcome.verification.passed
    for check in outcome.verification.checks:
        print(check.message)
    save_model(outcome.result.model, out / "cnn.checked.onnx")

    # 3. The analysis, its gates and a report: `qcli analyze ... --report FILE --min-compression 3`.
    report = analyze(CNN / "model.onnx", out / "cnn.checked.onnx", CNN / "eval", AnalyzeOptions(runs=10),
                     gates=Gates(min_compression=3.0))
    write_report(report, out / "cnn.report.md")
    if (failed := report.gate_error()) is not None:
        raise failed


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("out"))
    except QcliError as exc:  # bad input (exit_code 2) or a failed floor or gate (GateFailed, 1)
        print(f"error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        sys.exit(exc.exit_code)
