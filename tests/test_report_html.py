"""The HTML report renders in a real browser: headless Chromium takes a screenshot of it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_analyze import EVAL, FLOAT, quantize_cnn

from qcli.analyze import Gates, analyze, write_report

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_html_report_renders_in_chromium(tmp_path: Path):
    from PIL import Image

    quantized = quantize_cnn(tmp_path / "cnn.int8.onnx")
    report = analyze(FLOAT, quantized, EVAL, samples=128, runs=20, warmup=2,
                     gates=Gates(max_accuracy_drop=0.01, min_compression=2.0))
    page = write_report(report, tmp_path / "report.html")
    png = tmp_path / "report.png"
    profile = tmp_path / "chromium-profile"
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", f"--screenshot={png}", "--window-size=1200,2000", page.as_uri(),
    ]
    # HOME and XDG dirs in tmp_path: Chromium writes caches there, not in the user's home.
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert png.is_file(), f"no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
    assert png.stat().st_size > 50_000
    with Image.open(png) as image:
        assert image.size == (1200, 2000)
        rgb = image.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 100  # text, charts, cards: not a blank page
        # The page background is light grey; the cards and charts cover much of it.
        background = max(colours)[1]
        covered = sum(n for n, c in colours if c != background) / (1200 * 2000)
        assert covered > 0.3
        # The per-layer bars (green: every layer of the cnn is above 30 dB) are on the page.
        assert sum(n for n, (r, g, b) in colours if g > 140 and r < 60 and b < 110) > 2000
