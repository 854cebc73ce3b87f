"""The code-only bundle: one archive to run the synthetic GPU check on a machine given only Python and a PyTorch.

    .venv/bin/python scripts/bundle.py [--python 3.12] [--wheels DIR ...] [--out dist/mot-viz-synthetic.tar.gz]

The archive holds the code (the mot_viz package, the scripts and benchmarks/engine.py), the architecture and recipe
configs, and the exact wheels the synthetic check (scripts/gpu_check.py --synthetic) needs beyond PyTorch: the
requirement closure of what it imports (transformers, tokenizers, safetensors, numpy, pandas, tqdm, filelock), at the
versions installed in this checkout's environment (requirements.txt's pins), less what PyTorch itself requires (a
PyTorch install brings those). No network: each wheel is taken from a wheel folder (--wheels, pip's find-links, pip's
cache) or rebuilt from the installed package in .venv when its tags suit the target Python; a wheel found nowhere is
named with the `pip download` command that fetches it, and no archive is written. Unpacked anywhere, it runs with:

    tar -xzf mot-viz-synthetic.tar.gz && cd mot-viz && python3 -m pip install --no-index --no-deps --target .deps wheels/*.whl && PYTHONPATH=.deps python3 scripts/gpu_check.py --synthetic
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata as md
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags, parse_tag
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mot_viz.cli import run_cli  # noqa: E402
from mot_viz.errors import ConfigError  # noqa: E402
from mot_viz.fsutil import check_out_place, removed_on_failure  # noqa: E402

# what the synthetic check imports beyond PyTorch; their requirement closure is bundled
NEEDS = ("transformers", "tokenizers", "safetensors", "numpy", "pandas", "tqdm", "filelock")
CODE = ("mot_viz", "configs", "scripts/gpu_check.py", "scripts/gpu_check_synthetic.py", "benchmarks/engine.py",
        "pyproject.toml", "requirements.txt", "README.md")
LIMIT_MB = 60
FOLDER = "mot-viz"  # what the archive unpacks into
PLATFORM = "manylinux_2_28_x86_64"


def run_command(archive: str) -> str:
    """The one line that unpacks the archive and runs the synthetic check (on cuda)."""
    return (f"tar -xzf {archive} && cd {FOLDER} && python3 -m pip install --no-index --no-deps --target .deps "
            "wheels/*.whl && PYTHONPATH=.deps python3 scripts/gpu_check.py --synthetic")


def closure(roots, python: tuple[int, int]) -> dict[str, md.Distribution | None]:
    """Every distribution the roots require (no extras; markers for the target Python on Linux x86_64), by canonical
    name; None for one not installed here."""
    env = {**default_environment(), "python_version": f"{python[0]}.{python[1]}",
           "python_full_version": f"{python[0]}.{python[1]}.0", "sys_platform": "linux", "platform_machine": "x86_64",
           "platform_system": "Linux", "extra": ""}
    found, stack = {}, list(roots)
    while stack:
        name = canonicalize_name(stack.pop())
        if name in found:
            continue
        try:
            found[name] = md.distribution(name)
        except md.PackageNotFoundError:
            found[name] = None
            continue
        for line in found[name].requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env):
                stack.append(req.name)
    return found


def target_tags(python: tuple[int, int]) -> set[Tag]:
    """The wheel tags a CPython of version `python` on x86_64 Linux (glibc 2.28 or newer) installs."""
    platforms = [PLATFORM, *(f"manylinux_2_{minor}_x86_64" for minor in range(27, 4, -1)), "manylinux2014_x86_64",
                 "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    return set(cpython_tags(python, platforms=platforms)) | set(compatible_tags(python, platforms=platforms))


def folder_wheel(name: str, version: str, folders: list[Path], tags: set[Tag]) -> Path | None:
    """A wheel of name==version that suits the target, in one of the folders (searched recursively)."""
    for folder in folders:
        for wheel in sorted(folder.rglob("*.whl")) if folder.is_dir() else []:
            try:
                wname, wversion, _, wtags = parse_wheel_filename(wheel.name)
            except ValueError:
                continue
            if wname == name and str(wversion) == version and wtags & tags:
                return wheel
    return None


def installed_tags(dist: md.Distribution) -> set[Tag]:
    """The tags of the wheel an installed distribution came from (its WHEEL file)."""
    text = dist.read_text("WHEEL") or ""
    return {t for line in text.splitlines() if line.startswith("Tag:") for t in parse_tag(line.split(":", 1)[1].strip())}


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def rebuild_wheel(dist: md.Distribution, out: Path) -> Path:
    """The wheel of an installed distribution, rebuilt from its files (RECORD), byte for byte what was installed,
    without compiled caches or files installed outside site-packages (console scripts)."""
    tags = sorted(str(t) for t in installed_tags(dist))
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    tag = "-".join(".".join(sorted({t.split("-")[i] for t in tags})) for i in range(3))  # a compressed tag set
    path = out / f"{name}-{dist.version}-{tag}.whl"
    info = next(str(f).split("/")[0] for f in dist.files if str(f).split("/")[0].endswith(".dist-info"))
    record, skipped = [], {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for f in sorted(dist.files, key=str):
            rel = str(f)
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc") or (
                    rel.startswith(info + "/") and rel.split("/", 1)[1] in skipped):
                continue
            data = Path(dist.locate_file(f)).read_bytes()
            wheel.writestr(rel, data)
            record.append((rel, _record_hash(data), str(len(data))))
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows([*record, (f"{info}/RECORD", "", "")])
        wheel.writestr(f"{info}/RECORD", buffer.getvalue())
    return path


def pip_folders() -> list[Path]:
    """Folders of wheels pip already has here: its find-links (environment or config) and its cache's wheels."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        config = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
        links += [v for k, v in re.findall(r"^(\S*find-links)='(.*)'$", config, re.M) for v in v.split()]
        cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True).stdout
        links += [cache.strip()] if cache.strip() else []
    except OSError:
        pass
    return [Path(link.removeprefix("file://")) for link in links if link]


def gather_wheels(python: tuple[int, int], folders: list[Path], out: Path) -> tuple[list[Path], list[str]]:
    """The wheels of everything NEEDS requires beyond PyTorch's own requirements, written into `out`; and the
    `name==version` of each one found nowhere."""
    needed = closure(NEEDS, python)
    with_torch = set(closure(["torch"], python))
    tags = target_tags(python)
    wheels, missing = [], []
    for name, dist in sorted(needed.items()):
        if name in with_torch:
            continue
        if dist is None:
            missing.append(name)
            continue
        found = folder_wheel(name, dist.version, folders, tags)
        if found is not None:
            wheels.append(out / found.name)
            wheels[-1].write_bytes(found.read_bytes())
        elif installed_tags(dist) & tags:
            wheels.append(rebuild_wheel(dist, out))
        else:
            missing.append(f"{name}=={dist.version}")
    return wheels, missing


def code_files() -> list[str]:
    """The checkout's tracked files of the code and configs the check runs."""
    listed = subprocess.run(["git", "ls-files", *CODE], cwd=ROOT, capture_output=True, text=True, check=True)
    return [f for f in listed.stdout.splitlines() if (ROOT / f).is_file()]


def build(out: Path, python: tuple[int, int], folders: list[Path], work: Path) -> tuple[Path, list[Path]]:
    """Write the archive; ConfigError (with the fetch command) when a wheel is missing or it exceeds LIMIT_MB."""
    wheel_dir = work / "wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheels, missing = gather_wheels(python, folders, wheel_dir)
    if missing:
        version = f"{python[0]}.{python[1]}"
        raise ConfigError(
            f"no wheel for Python {version} of {', '.join(missing)} here (neither in a wheel folder nor installed for "
            f"that Python): fetch them once with `pip download --only-binary=:all: --no-deps --python-version {version} "
            f"--platform {PLATFORM} -d wheels {' '.join(missing)}` and run this again with --wheels wheels.")
    readme = (f"# MoT Viz, code only\n\nThe code, the configs and the wheels (Python {python[0]}.{python[1]}, "
              f"Linux x86_64) the synthetic GPU check needs beyond PyTorch. Run it with:\n\n    "
              f"{run_command(out.name)}\n\nAdd `--device cpu --quick` for the CPU's small mode. What it checks: "
              "scripts/gpu_check_synthetic.py.\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    with removed_on_failure(tmp):  # a full disk, Ctrl-C: no half archive is left behind
        with tarfile.open(tmp, "w:gz") as archive:
            for rel in code_files():
                archive.add(ROOT / rel, f"{FOLDER}/{rel}", recursive=False)
            for wheel in wheels:
                archive.add(wheel, f"{FOLDER}/wheels/{wheel.name}")
            data = readme.encode()
            info = tarfile.TarInfo(f"{FOLDER}/BUNDLE.md")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        size = tmp.stat().st_size / 2**20
        if size > LIMIT_MB:
            raise ConfigError(f"the bundle is {size:.1f} MB, over its {LIMIT_MB} MB limit: {len(wheels)} wheels; drop "
                              "a dependency of the synthetic check.")
        os.replace(tmp, out)
    return out, wheels


def is_bundle(path: Path) -> bool:
    """Whether the file at path is an archive this command wrote (a gzipped tar whose first member lies in FOLDER),
    which a later run may replace; told from its first member, without reading it whole."""
    try:
        with tarfile.open(path, "r:gz") as archive:
            first = archive.next()
    except (OSError, tarfile.TarError, EOFError):
        return False
    return first is not None and first.name.split("/", 1)[0] == FOLDER


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="3.12", help="the Python version of the machine that runs it (3.12)")
    parser.add_argument("--wheels", nargs="*", default=[], help="folders of wheels to take them from first")
    parser.add_argument("--out", default=str(ROOT / "dist" / "mot-viz-synthetic.tar.gz"),
                        help="the archive written (an earlier bundle there is replaced)")
    parser.add_argument("--overwrite", action="store_true", help="replace an --out file that is not a bundle")
    args = parser.parse_args(argv)
    check_out_place(Path(args.out), folder=False, ours=is_bundle, overwrite=args.overwrite)  # before gathering wheels
    match = re.fullmatch(r"3\.(\d+)", args.python)
    if match is None:
        raise ConfigError(f"--python {args.python}: give a CPython version such as 3.12.")
    python = (3, int(match.group(1)))
    with tempfile.TemporaryDirectory(prefix="bundle-") as work:
        out, wheels = build(Path(args.out), python, [Path(w) for w in args.wheels] + pip_folders(), Path(work))
    print(f"{out} ({out.stat().st_size / 2**20:.1f} MB, {len(wheels)} wheels). Run it with:\n{run_command(out.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
