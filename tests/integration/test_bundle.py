"""The code-only bundle (scripts/bundle.py): built from the checkout without network, under its size limit, and,
unpacked into an empty folder, it runs the synthetic check's CPU quick mode with PyTorch and the bundle's own wheels
alone (this environment's other packages out of sight)."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from bundle import FOLDER, LIMIT_MB, closure  # noqa: E402
from test_gpu_check_synthetic import check_quick_run  # noqa: E402


def torch_only(folder: Path) -> Path:
    """A folder holding (as links) PyTorch and what it requires, and nothing else of this environment."""
    folder.mkdir()
    for dist in closure(["torch"], sys.version_info[:2]).values():
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)
    return folder


def test_the_bundle_is_small_and_runs_the_synthetic_check_from_an_empty_folder(tmp_path):
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    archive = tmp_path / "mot-viz-synthetic.tar.gz"
    built = subprocess.run([sys.executable, str(ROOT / "scripts" / "bundle.py"), "--python", python, "--out",
                            str(archive)], capture_output=True, text=True, cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    assert archive.stat().st_size < LIMIT_MB * 2**20
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert f"{FOLDER}/configs/architectures/llama3.1-8b.json" in names and f"{FOLDER}/scripts/gpu_check.py" in names
    wheels = [n for n in names if n.endswith(".whl")]
    assert any("/transformers-" in n for n in wheels) and not any("/torch-" in n for n in wheels)
    assert not any(n.startswith(f"{FOLDER}/pretrained") or n.startswith(f"{FOLDER}/results") for n in names)
    # the one line of the README's GPU paragraph, with this Python, -S keeping the environment's packages out of sight
    place = tmp_path / "empty"
    place.mkdir()
    deps = f"{torch_only(tmp_path / 'torch')}"
    line = built.stdout.strip().splitlines()[-1]
    assert line.startswith(f"tar -xzf {archive.name} && cd {FOLDER} && python3 -m pip install --no-index --no-deps")
    line = (line.replace(f"tar -xzf {archive.name}", f"tar -xzf {archive}")
            .replace("python3 -m pip", f"{sys.executable} -m pip")
            .replace("PYTHONPATH=.deps python3", f"PYTHONPATH=.deps:{deps} {sys.executable} -S")
            + " --device cpu --quick --out ../gpu.md")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.pop("PYTHONPATH", None)
    run = subprocess.run(line, shell=True, env=env, capture_output=True, text=True, cwd=place)
    check_quick_run(run, place / "gpu.md")
    assert f"Python {platform.python_version()}" in (place / "gpu.md").read_text()
    assert md.version("transformers") in (place / "gpu.md").read_text()
