"""The GPU check's synthetic part (scripts/gpu_check.py --synthetic) in its CPU quick mode: no model file, checkpoint
or dataset, and every comparison it makes passes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_check_synthetic import SECTIONS, TITLE  # noqa: E402


def check_quick_run(run: subprocess.CompletedProcess, out: Path) -> str:
    """Assert what the CPU quick mode must write; returns its part of `out`."""
    assert run.returncode == 0, run.stderr[-3000:]
    assert "all checks pass" in run.stderr
    text = out.read_text()
    part = text[text.index(TITLE):]
    headings = re.findall(r"^## (.+)$", part, re.M)
    assert headings == list(SECTIONS), headings
    sections = dict(zip(headings, re.split(r"^## .+$", part, flags=re.M)[1:]))
    checked = re.findall(r"^\| (\d+) \| (translate|replay|answers|logit lens) \| (\S+) \| 1e-03 \| (\w+) \|$",
                         sections[SECTIONS[0]], re.M)
    assert len(checked) == 2 * 4 and all(result == "pass" for *_, result in checked)  # 2 contexts, 4 quantities
    assert all(float(error) == 0.0 for _, _, error, _ in checked)  # on the CPU the "device" run is the CPU's own
    assert len(re.findall(r"^\| \d+ \| (translate|replay|answers|logit lens) \| \S+ \|$", sections[SECTIONS[1]],
                          re.M)) == 8
    assert "bit for bit (pass)" in sections[SECTIONS[2]]
    engine = sections[SECTIONS[3]]
    assert "### synthetic:smollm2-135m → synthetic:gemma3-270m" in engine
    assert re.search(r"^\| 64 \| .*\|$", engine, re.M), engine  # a row of the 64-token length
    assert "Dense replay" in engine and "Full-depth map without replay" in engine and "Where the time goes" in engine
    assert "no quality" in part and "identity on a shared id stream" in part
    return part


def test_the_synthetic_check_runs_on_the_cpu_and_keeps_the_other_part_of_its_file(tmp_path):
    out = tmp_path / "gpu.md"
    out.write_text("# The GPU check\n\nThe real-weights part, kept.\n")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--synthetic", "--device", "cpu",
                          "--quick", "--out", str(out)], env=env, capture_output=True, text=True, cwd=tmp_path)
    check_quick_run(run, out)
    assert "# The GPU check\n\nThe real-weights part, kept." in out.read_text()
