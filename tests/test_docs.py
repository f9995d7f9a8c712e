"""The documentation: the site builds strictly (a broken link or anchor, a page missing from the
nav, a missing benchmark table fails), the generated references are up to date and name every
key of the schemas, the examples run, and the README stays a front door (issue 49)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from types import NoneType, UnionType

import pytest
from pydantic import BaseModel

from conftest import REPO
from qcli.config import Config
from qcli.configdoc import PAGES
from qcli.pipeline import Pipeline, load_pipeline

REFERENCE = REPO / "docs" / "reference"


def test_site_builds_strictly(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()


@pytest.mark.parametrize("name", sorted(PAGES))
def test_generated_reference_is_up_to_date(name: str) -> None:
    assert (REFERENCE / name).read_text(encoding="utf-8") == PAGES[name](), (
        f"docs/reference/{name} is stale: run `make docs` (or `python -m qcli.configdoc docs/reference`) and commit it"
    )


def schema_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key path of `model`, sections and leaves (`overrides[].match.nodes`), walked here
    independently of qcli.configdoc."""
    paths = []
    for name, field in model.model_fields.items():
        path = prefix + name
        paths.append(path)
        annotation, many = field.annotation, False
        if typing.get_origin(annotation) in (typing.Union, UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not NoneType)
        if typing.get_origin(annotation) is list:
            annotation, many = typing.get_args(annotation)[0], True
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths += schema_paths(annotation, path + ("[]." if many else "."))
    return paths


@pytest.mark.parametrize(("page", "schema", "some"), [
    ("configuration.md", Config, {"calibration", "calibration.method", "verify.outputs", "target.batch",
                                  "overrides[].match.nodes", "data.preprocess.resize", "recovery.smoothquant.alpha"}),
    ("pipeline.md", Pipeline, {"model", "gates", "gates.min_speedup", "analyze.runs"}),
])
def test_every_schema_key_is_in_the_reference(page: str, schema: type[BaseModel], some: set[str]) -> None:
    text = (REFERENCE / page).read_text(encoding="utf-8")
    paths = schema_paths(schema)
    assert some <= set(paths)  # the walk reaches sections, nested sections and list items
    missing = [p for p in paths if f"`{p}`" not in text]
    assert not missing, f"keys missing from docs/reference/{page}: {missing}"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_key_has_a_description(page: str) -> None:
    rows = [line.split(" | ") for line in (REFERENCE / page).read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")]
    assert rows
    undescribed = [row[0].strip("| `") for row in rows if not row[-1].strip(" |")]
    assert not undescribed, f"give these keys a Field(description=...): {undescribed}"


def test_example_pipeline_is_valid() -> None:
    pipeline, config = load_pipeline(REPO / "docs" / "examples" / "pipeline.yaml")
    base = REPO / "docs" / "examples"
    for path in (pipeline.model, pipeline.calibration_data, pipeline.eval_data):
        assert path is not None and (base / path).exists(), path
    assert config.target.profile == "x86-64-avx512vnni"  # pinned: the same verdicts on any CI runner


def test_python_api_example_runs(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "docs/examples/python_api.py", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "verified: True" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.checked.onnx", "cnn.int8.onnx", "cnn.report.md"]


def test_readme_is_a_front_door() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert links, "the README links into docs/"
    assert [link for link in links if not (REPO / link).is_file()] == []
