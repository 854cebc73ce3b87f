"""The prepared GPU check (scripts/gpu_check.py) in its CPU mode: its code path stays alive without a GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_check import SECTIONS  # noqa: E402


def test_the_gpu_check_runs_on_the_cpu_and_every_comparison_it_makes_passes(tmp_path):
    out = tmp_path / "gpu.md"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu", "--quick",
                          "--out", str(out)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    table = out.read_text()
    headings = re.findall(r"^## (.+)$", table, re.M)
    assert headings == list(SECTIONS), headings
    parts = dict(zip(headings, re.split(r"^## .+$", table, flags=re.M)[1:]))
    same = parts[SECTIONS[0]]
    checked = re.findall(r"^\| (\S+) \| (translate|replay|answers|logit lens) \| (\S+) \| 1e-03 \| (\w+) \|$", same, re.M)
    assert len(checked) == 2 * 4 and all(result == "pass" for *_, result in checked), same  # 2 contexts, 4 quantities
    assert all(float(error) == 0.0 for _, _, error, _ in checked)  # on the CPU the "device" run is the CPU's own
    assert len(re.findall(r"^\| \S+ \| (translate|replay|answers|logit lens) \| \S+ \|$", parts[SECTIONS[1]], re.M)) == 8
    assert "bit for bit (pass)" in parts[SECTIONS[2]]
    evaluation = parts[SECTIONS[3]]
    assert "1 SQuAD example (seed 0), conditions native, no_context, mot, random, mean, relay" in evaluation
    assert "| squad/validation | native |" in evaluation and "| squad/validation | mot |" in evaluation, evaluation
    assert re.search(r"^\|.*\b64\b.*\|$", parts[SECTIONS[4]], re.M), parts[SECTIONS[4]]  # a row of the 64-token length
    assert "all checks pass" in run.stderr


def test_an_out_it_cannot_write_is_refused_before_any_work(tmp_path):
    """A folder, or a path inside a file, as --out: one line and status 2 at once, not a traceback after a minute's
    work, and nothing left behind."""
    (tmp_path / "notes.txt").write_text("mine")
    for out, words in ((tmp_path, f"--out {tmp_path} is a folder. Pass a file's path"),
                       (tmp_path / "notes.txt" / "gpu.md", f"lies inside the file {tmp_path / 'notes.txt'}")):
        run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu", "--quick",
                              "--out", str(out)], capture_output=True, text=True, cwd=tmp_path)
        assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr[-3000:]
        assert run.stderr.startswith("error: ConfigError: ") and words in run.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
