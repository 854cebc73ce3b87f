"""The bundled-model conversion cache: once, under a lock, atomic, never half-written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for the GGUF conversion that is slow and leaves a trace, so two processes can race for it.
WORKER = """
import os, sys, time
import mot_viz.engine.model_files as m

def slow_convert(gguf_path, out_dir):
    with open(os.path.join(os.environ['MOT_VIZ_CACHE'], 'conversions.log'), 'a') as f:
        f.write(str(os.getpid()) + '\\n')
    tmp = out_dir.with_name(out_dir.name + '.tmp-' + str(os.getpid()))
    tmp.mkdir(parents=True)
    (tmp / 'weights').write_text('x' * 1000)
    time.sleep(1.5)
    (tmp / 'mot_viz_conversion.json').write_text('{{}}')
    os.replace(tmp, out_dir)

m.convert_gguf = slow_convert
m._bundled_gguf = lambda name, work: work / 'fake.gguf'
print(m.bundled_model_dir('smollm2-135m'))
"""


def _run_workers(cache: Path, n: int) -> list[str]:
    script = cache / "worker.py"
    script.write_text(WORKER.format())
    env = {**os.environ, "MOT_VIZ_CACHE": str(cache)}
    procs = [subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return outs


def test_two_processes_convert_once_and_both_get_the_complete_folder(tmp_path):
    outs = _run_workers(tmp_path, 2)
    assert outs[0] == outs[1]
    folder = Path(outs[0])
    assert (folder / "mot_viz_conversion.json").exists() and (folder / "weights").read_text() == "x" * 1000
    assert len((tmp_path / "conversions.log").read_text().split()) == 1  # the second process waited, then reused
    assert not list((tmp_path / "models").glob("*.tmp-*")) and not list((tmp_path / "models").glob("*.work-*"))


def test_a_half_written_folder_is_never_used(tmp_path):
    half = tmp_path / "models" / "smollm2-135m-v1"
    half.mkdir(parents=True)
    (half / "weights").write_text("truncated")  # no completion marker: an interrupted conversion
    (folder,) = _run_workers(tmp_path, 1)
    assert Path(folder) == half and (half / "weights").read_text() == "x" * 1000
    assert len((tmp_path / "conversions.log").read_text().split()) == 1
