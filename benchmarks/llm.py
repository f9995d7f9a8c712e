"""Language models: qcli's weight-only presets beside onnxruntime's MatMulNBits quantizer, on a
decoder trained on real text and judged on held-out text.

    PYTHONPATH=. .venv/bin/python benchmarks/llm.py                  # the decoder of `make llm-models`
    PYTHONPATH=. .venv/bin/python benchmarks/llm.py --model DIR     # DIR/model.onnx, DIR/text/{calib,eval}
    PYTHONPATH=. .venv/bin/python benchmarks/llm.py --markdown      # also benchmarks/results/llm.md

Each tool quantizes the same file: `qcli quantize MODEL --data text/calib --seq-len 128 --config
PRESET` as a user runs it, and onnxruntime's `MatMulNBitsQuantizer` (its default blockwise
round-to-nearest, symmetric, block 32: `python -m onnxruntime.quantization.matmul_nbits_quantizer
--block_size 32 --symmetric`). Every model is then measured here, not by qcli:
- perplexity on `text/eval` (text no run read), chunks of 128 tokens fed as prompts, the mean
  negative log-likelihood of each next token; its increase over the float model's;
- next-token agreement: positions whose argmax (greedy decoding's choice) equals float's;
- size: the model's files (external data included), compression against the float file;
- speed, batch 1, one thread (`SPEED_THREADS`): prefill of a 64-token prompt, then 64 greedy
  decode steps feeding `present.*` back as the past; tokens/s of each, medians over rounds run
  A/B (every model once per round, in turn, the order reversed every other round). qcli's
  DequantizeLinear + MatMul runs as the MatMulNBits onnxruntime fuses it into, with the fusion's
  default accuracy level 4 (activations to int8 inside the kernel); onnxruntime's quantizer
  writes MatMulNBits without one (level 0: float compute).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exported import PEAK  # noqa: E402  (benchmarks/exported.py: what a child reports its peak RSS as)
from sheet import ROOT, THREADS, Sheet, add_markdown_option, bench_page  # noqa: E402  (benchmarks/sheet.py)

DEFAULT_MODEL = ROOT / ".llm-models" / "decoder"
SEQ_LEN = 128
PROMPT, STEPS = 64, 64
# The timed sessions' threads: at batch 1 a 4M-parameter decoder's kernels take microseconds, too
# little to split, and two threads' hand-offs made the medians of identical models differ by up
# to 2x between runs (one thread: within 10%).
SPEED_THREADS = 1


def session(path: Path, threads: int = THREADS):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def past_shapes(sess) -> dict[str, list]:
    return {i.name: i.shape for i in sess.get_inputs() if "past" in i.name}


def feeds(sess, ids: np.ndarray, past: dict[str, np.ndarray] | None, start: int) -> dict[str, np.ndarray]:
    """One call's inputs: `ids` [1, L] at positions start.., the cache so far (None: empty)."""
    length = ids.shape[1]
    out = {"input_ids": ids, "attention_mask": np.ones((1, start + length), np.int64),
           "position_ids": np.arange(start, start + length, dtype=np.int64)[None]}
    for name, shape in past_shapes(sess).items():
        if past is None:
            dims = [1 if i == 0 else 0 if not isinstance(d, int) else d for i, d in enumerate(shape)]
            out[name] = np.zeros(dims, np.float32)
        else:
            out[name] = past[name.replace("past_key_values", "present")]
    known = {i.name for i in sess.get_inputs()}
    return {k: v for k, v in out.items() if k in known}


def eval_chunks(model_dir: Path) -> list[np.ndarray]:
    """The held-out text as [1, SEQ_LEN] token rows, with the model's tokenizer."""
    from qcli.data.text import chunks, documents, tokenizer

    folder = model_dir / "text" / "eval"
    tok = tokenizer(folder / "tokenizer.json")
    rows: list[np.ndarray] = []
    for path in sorted(folder.glob("*.txt")):
        rows += [np.array([c], np.int64) for c in chunks(tok.encode(documents(path)).ids, SEQ_LEN) if len(c) == SEQ_LEN]
    return rows


def text_scores(path: Path, rows: list[np.ndarray]) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
    """(summed NLL of the next tokens, each chunk's next-token NLLs, each chunk's argmax ids)."""
    sess = session(path)
    names = [o.name for o in sess.get_outputs()]
    total, nlls, argmaxes = 0.0, [], []
    for ids in rows:
        logits = sess.run([names[0]], feeds(sess, ids, None, 0))[0][0].astype(np.float64)
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        nll = -logp[np.arange(ids.shape[1] - 1), ids[0, 1:]]
        total += float(nll.sum())
        nlls.append(nll)
        argmaxes.append(logits.argmax(-1))
    return total, nlls, argmaxes


def decode_round(sess, prompt: np.ndarray) -> tuple[float, float]:
    """Seconds of one prefill of `prompt` and of STEPS greedy decode steps after it."""
    names = [o.name for o in sess.get_outputs()]
    began = time.perf_counter()
    out = dict(zip(names, sess.run(None, feeds(sess, prompt, None, 0)), strict=True))
    prefill = time.perf_counter() - began
    token = out[names[0]][:, -1:].argmax(-1)
    began = time.perf_counter()
    for step in range(STEPS):
        out = dict(zip(names, sess.run(None, feeds(sess, token.astype(np.int64), out, PROMPT + step)), strict=True))
        token = out[names[0]][:, -1:].argmax(-1)
    return prefill, time.perf_counter() - began


def speeds(paths: dict[str, Path], prompt: np.ndarray, rounds: int) -> dict[str, tuple[float, float]]:
    """Per model, (prefill tokens/s, decode tokens/s): medians over `rounds` A/B rounds."""
    sessions = {k: session(p, SPEED_THREADS) for k, p in paths.items()}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in paths}
    for s in sessions.values():  # warm-up
        decode_round(s, prompt)
    for r in range(rounds):
        order = list(sessions) if r % 2 == 0 else list(sessions)[::-1]
        for k in order:
            times[k].append(decode_round(sessions[k], prompt))
    return {k: (PROMPT / float(np.median([t[0] for t in v])), STEPS / float(np.median([t[1] for t in v])))
            for k, v in times.items()}


def size(path: Path) -> int:
    return path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(path.name + ".data"))


def run_qcli(model: Path, calib: Path, out: Path, preset: str) -> tuple[str, float]:
    began = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "qcli.cli", "quantize", str(model), "-o", str(out), "--data",
                             str(calib), "--seq-len", str(SEQ_LEN), "--config", *preset.split(), "--json", "--quiet"],
                            capture_output=True, text=True)
    took = time.perf_counter() - began
    if result.returncode not in (0, 1):
        raise RuntimeError(f"qcli exit {result.returncode}: {result.stderr.strip()[-500:]}")
    doc = json.loads(result.stdout)
    passed = (doc.get("verification") or {}).get("passed")
    return f"exit {result.returncode}{'' if passed is None else ', verified' if passed else ', floor missed'}", took


def run_ort_rtn(model: Path, out: Path, block: int = 32) -> tuple[str, float]:
    import onnx

    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as exc:  # it imports onnx_ir, which onnxruntime does not depend on
        raise SystemExit(f"onnxruntime's MatMulNBits quantizer cannot load ({exc}): pip install onnx-ir") from None

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)  # a line a node
    began = time.perf_counter()
    quantizer = MatMulNBitsQuantizer(onnx.load(str(model)), block_size=block, is_symmetric=True)
    quantizer.process()
    quantizer.model.save_model_to_file(str(out), use_external_data_format=False)
    return "done", time.perf_counter() - began


LARGE = dict(vocab=32000, d=1024, heads=16, layers=24, mlp=4, positions=512)  # GPT-2 medium's shapes: 368M


def measured(*args: str) -> tuple[float, float, int]:
    """This script's `--child ARGS` in its own process: wall seconds, peak RSS (MB, the VmHWM it
    reports at exit: a forked child's ru_maxrss starts from this process's), exit code."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", *args], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    took = time.perf_counter() - began
    peak = next((float(line.split()[1]) for line in reversed(done.stderr.splitlines()) if line.startswith(PEAK)),
                float("nan"))
    return took, peak / 1024, done.returncode


def child(kind: str, model: str, out: str, calib: str) -> int:
    """Child side: `generate` the large decoder at `out` (with `model` layers), `qcli PRESET` or `ort`
    quantize `model`."""
    import atexit
    import runpy

    from exported import report_peak

    atexit.register(report_peak)
    if kind == "generate":
        sys.path.insert(0, str(ROOT / "tests"))
        from decoders import decoder, save

        save(decoder(**{**LARGE, "layers": int(model)}), Path(out), external=True)  # model: the layers
        return 0
    if kind == "ort":
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        quantizer = MatMulNBitsQuantizer(onnx.load(model), block_size=32, is_symmetric=True)
        quantizer.process()
        quantizer.model.save_model_to_file(out, use_external_data_format=True)
        return 0
    sys.argv = ["qcli", "quantize", model, "-o", out, "--data", calib, "--seq-len", str(SEQ_LEN), "--samples", "32",
                "--config", kind, "--quiet"]
    runpy.run_module("qcli.cli", run_name="__main__")
    return 0


def large(page, calib: Path, presets: list[str], work: Path, layers: int) -> Sheet:
    """The large decoder (LARGE's shapes with `layers` layers) quantized by each tool: wall time,
    peak RSS against the float file."""
    model = work / "model.onnx"
    page.print(f"generating the large decoder ({ {**LARGE, 'layers': layers} }) ...")
    measured("generate", str(layers), str(model), "")
    weights = size(model)
    import onnx

    params = sum(int(np.prod(i.dims)) for i in onnx.load(str(model), load_external_data=False).graph.initializer)
    table = Sheet(f"a {params / 1e6:.0f}M-parameter decoder ({layers} layers, d {LARGE['d']}, "
                  f"vocab {LARGE['vocab']}, random weights, external data: {weights / 1e9:.2f} GB): 32 chunks of "
                  f"{SEQ_LEN} tokens",
                  ["tool", ("wall", "right"), ("peak RSS", "right"), ("written", "right")])
    unverified = work / "weights-int4-unverified.yaml"  # what onnxruntime's quantizer does: no verification
    preset = (ROOT / "configs" / "weights-int4.yaml").read_text()
    unverified.write_text(preset.replace("verify: {max_latency_ratio: null}", "verify: {enabled: false}"))
    if "enabled: false" not in unverified.read_text():
        raise SystemExit("configs/weights-int4.yaml's verify line changed: update benchmarks/llm.py's copy of it")
    runs = [(f"qcli {p}", p) for p in presets] + [("qcli weights-int4, verify.enabled false", str(unverified)),
                                                  ("onnxruntime RTN int4 b32", "ort")]
    for name, kind in runs:
        out = work / f"{Path(kind).stem}.onnx"
        page.print(f"{name} ...")
        took, peak, code = measured(kind, str(model), str(out), str(calib))
        written = f"{size(out) / 1e6:.0f} MB" if out.is_file() else "none"
        table.add_row(name + ("" if code in (0, 1) else f" (exit {code})"), f"{took:.0f} s",
                      f"{peak / 1e3:.2f} GB\n{peak * 1e6 / weights:.2f}x the file", written)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a folder with model.onnx and text/")
    parser.add_argument("--presets", nargs="+",
                        default=["weights-int4", "llm-int4", "llm-awq", "llm-hqq", "llm-int8", "llm-mixed",
                                 "llm-mixed --max-size-mb 4"],
                        help="qcli presets or config files, each run as --config (flags may follow: quote both)")
    parser.add_argument("--rounds", type=int, default=31, help="A/B rounds of the speed measure")
    parser.add_argument("--large", action="store_true", help="also the 368M-parameter decoder (random weights, "
                        "generated here): wall time and peak memory of each tool, about 15 minutes")
    parser.add_argument("--large-layers", type=int, default=LARGE["layers"], help="the large decoder's layers (40: "
                        "570M parameters, 2.28 GB of external data, past protobuf's 2 GB)")
    parser.add_argument("--large-presets", nargs="+", default=["weights-int4", "llm-int4", "llm-awq"],
                        help="the qcli presets run on the large decoder, verified")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    add_markdown_option(parser, __file__)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    model = args.model / "model.onnx"
    if not model.is_file():
        print(f"skipped: {model} not found (`make llm-models` builds it)")
        return 0
    page = bench_page(args.markdown, f"chunks of {SEQ_LEN} tokens, decode {STEPS} steps after {PROMPT}, timed on "
                      f"{SPEED_THREADS} thread", threads=None)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qcli-bench-llm-") as tmp:
        paths, how = {"float": model}, {"float": ("", 0.0)}
        for preset in args.presets:
            out = Path(tmp) / ("qcli." + re.sub(r"[^\w.-]+", "_", preset) + ".onnx")
            page.print(f"qcli --config {preset} ...")
            how[f"qcli {preset}"] = run_qcli(model, args.model / "text" / "calib", out, preset)
            paths[f"qcli {preset}"] = out
        page.print("onnxruntime MatMulNBits RTN int4 block 32 ...")
        out = Path(tmp) / "ort.rtn.onnx"
        how["onnxruntime RTN int4 b32"] = run_ort_rtn(model, out)
        paths["onnxruntime RTN int4 b32"] = out
        rows = eval_chunks(args.model)
        page.print(f"perplexity on {len(rows)} held-out chunks ...")
        scores = {k: text_scores(p, rows) for k, p in paths.items()}
        page.print(f"speed: {args.rounds} A/B rounds ...")
        speed = speeds(paths, rows[0][:, :PROMPT], args.rounds)
        table = Sheet(f"{args.model.name}: {len(rows)} held-out chunks of {SEQ_LEN} tokens "
                      f"({len(rows) * (SEQ_LEN - 1)} next tokens), batch 1",
                      ["model", "run", ("size", "right"), ("perplexity", "right"), ("next token = float's", "right"),
                       ("prefill tok/s", "right"), ("decode tok/s", "right")])
        f_total, _, f_arg = scores["float"]
        count = len(rows) * (SEQ_LEN - 1)
        for k, p in paths.items():
            total, nlls, argmax = scores[k]
            ppl = float(np.exp(total / count))
            increase = np.exp((total - f_total) / count) - 1
            agree = float(np.mean(np.concatenate([a[:-1] == b[:-1] for a, b in zip(argmax, f_arg, strict=True)])))
            status, took = how[k]
            prefill, decode = speed[k]
            f_prefill, f_decode = speed["float"]
            table.add_row(k, f"{status}, {took:.1f} s" if status else "", f"{size(p) / 1e6:.2f} MB\n"
                          f"{size(model) / size(p):.2f}x smaller", f"{ppl:.3f}\n{increase:+.2%}",
                          f"{agree:.2%}", f"{prefill:.0f}\n{prefill / f_prefill:.2f}x",
                          f"{decode:.0f}\n{decode / f_decode:.2f}x")
        if args.large:
            large_table = large(page, args.model / "text" / "calib", args.large_presets, Path(tmp), args.large_layers)
    page.table(table)
    if args.large:
        page.table(large_table)
    page.line(f"benchmark took {time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.1f}")
    page.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
