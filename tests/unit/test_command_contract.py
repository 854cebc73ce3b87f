"""One output contract for every command that writes (fsutil.check_out_place, docs/reliability.md "Output places"):
each `python -m mot_viz.…` command and each scripts/*.py with an --out, run as its `__main__` with an output place
it must refuse — a folder holding a user's file, a read-only place, a file where a folder belongs (or the reverse), a
path inside a file — exits with status 2 and one line naming the fix, before any model loads, with every file it found
byte-identical and nothing left behind. A new command that is not listed here fails the test."""

from __future__ import annotations

import re
import runpy
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from mot_viz.engine import models, synthetic

ROOT = Path(__file__).resolve().parents[2]
READ_ONLY = Path("/sys")  # even root cannot create files there (sysfs), unlike a folder chmod-ed read-only


@dataclass(frozen=True)
class Command:
    """A command and what its output place is.

    kind: "folder" (a folder it writes; a user's file there is refused), "into" (a results folder it reads and adds
    its own files to), "file" (a file it writes whole; a user's file there is refused), "part" (a markdown file it
    writes its own part of; a file that is not UTF-8 text is refused, every byte outside its part kept)."""

    entry: str  # a module (python -m) or a script's path from the checkout
    kind: str
    argv: tuple[str, ...]  # "{out}" is the output place, "{ck}" a checkpoint of the tiny pair


COMMANDS = (
    Command("mot_viz.eval.evaluate", "folder", ("--checkpoint", "{ck}", "--datasets", "squad", "--n", "1", "--out",
                                                "{out}")),
    Command("mot_viz.eval.long_context", "folder", ("--checkpoint", "{ck}", "--budgets", "512", "--out", "{out}")),
    Command("mot_viz.eval.conversation", "folder", ("--checkpoint", "{ck}", "--out", "{out}")),
    Command("mot_viz.eval.shards", "folder", ("--checkpoint", "{ck}", "--out", "{out}")),
    Command("mot_viz.eval.fidelity", "folder", ("--checkpoint", "{ck}", "--out", "{out}")),
    Command("mot_viz.eval.layer_error", "into", ("{out}",)),
    Command("mot_viz.eval.patching", "into", ("{out}",)),
    Command("mot_viz.eval.costs", "into", ("{out}",)),
    Command("mot_viz.train.export", "folder", ("{ck}", "{out}")),
    Command("mot_viz.train.quickfit", "folder", ("--source", "smollm2-135m", "--target", "gemma3-270m", "--out",
                                                 "{out}")),
    Command("mot_viz.train.synthetic_checkpoint", "folder", ("--source", "synthetic:smollm2-135m@1", "--target",
                                                             "synthetic:gemma3-270m@1", "--out", "{out}")),
    Command("mot_viz.train.train", "folder", ("--config", str(ROOT / "configs" / "smollm2-to-gemma3.json"),
                                              "--output_dir", "{out}")),
    Command("mot_viz.train.rival", "folder", ("--method", "lsc", "--output_dir", "{out}")),
    Command("scripts/bundle.py", "file", ("--out", "{out}")),
    Command("scripts/gpu_check.py", "part", ("--device", "cpu", "--quick", "--out", "{out}")),
    Command("scripts/gpu_check.py", "part", ("--synthetic", "--device", "cpu", "--quick", "--out", "{out}")),
    Command("scripts/gpu_check_synthetic.py", "part", ("--device", "cpu", "--quick", "--out", "{out}")),
    Command("scripts/doc_figures.py", "folder", ("long", "{ck}", "--out", "{out}")),
    Command("scripts/long_positions.py", "file", ("--checkpoint", "{ck}", "--out", "{out}")),
    Command("scripts/shift_sweep.py", "folder", ("--out", "{out}")),
    Command("scripts/verdict_validation.py", "folder", ("signals", "--checkpoint", "{ck}", "--out", "{out}")),
    Command("scripts/verdict_validation.py", "folder", ("report", "--eval", "{ck}", "--out", "{out}")),
)
# commands that write no place their user names, and why
NO_OUTPUT = {"mot_viz.engine.models": "`prepare` writes only the model cache, $MOT_VIZ_CACHE "
                                      "(tests/unit/test_hostile_models.py: a file or read-only cache)"}


def test_every_command_is_listed():
    """Each module with a `__main__` entry, and each script with an --out, is on the list: a new one fails here until
    it obeys the contract (and is added) or says why it writes nothing a user names."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "mot_viz").rglob("*.py")
               if 'if __name__ == "__main__"' in p.read_text()}
    scripts = {str(p.relative_to(ROOT)) for p in (ROOT / "scripts").glob("*.py")
               if re.search(r"add_argument\(\s*\"--out\"", p.read_text())}
    listed = {c.entry for c in COMMANDS}
    assert modules == {e for e in listed if e.startswith("mot_viz.")} | set(NO_OUTPUT)
    assert scripts == {e for e in listed if e.startswith("scripts/")}


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for a folder)."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def read_only_place() -> bool:
    try:
        tempfile.TemporaryFile(dir=READ_ONLY).close()
    except OSError:
        return True
    return False


def places(kind: str, root: Path) -> list[tuple[str, Path, str]]:
    """(case, the output place, words the refusal says) for a command of `kind`; the user's files made in root."""
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("a user's notes\n")
    (root / "report.bin").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe not text")
    (root / "notes.txt").write_text("a user's file\n")
    cases = [("inside a file", root / "notes.txt" / "out", "lies inside the file")]
    if read_only_place():
        cases.append(("read-only", READ_ONLY / "mot-viz-contract" / "out", "Cannot write into"))
    if kind in ("folder", "into"):
        cases.append(("a file where a folder belongs", root / "notes.txt", "is a file"))
    else:
        cases.append(("a folder where a file belongs", root / "mine", "is a folder"))
    if kind == "folder":
        cases.append(("a folder holding a user's file", root / "mine", "notes.txt"))
    if kind == "file":
        cases.append(("a user's file", root / "notes.txt", "did not write"))
    if kind == "part":
        cases.append(("a user's file that is not text", root / "report.bin", "did not write"))
    return cases


def run(command: Command, argv: list[str], monkeypatch) -> int:
    """The command run as its `__main__` (python -m MODULE, python SCRIPT) in this process: its exit status."""
    monkeypatch.setattr(sys, "argv", [command.entry, *argv])
    try:
        if command.entry.startswith("scripts/"):
            monkeypatch.syspath_prepend(str(ROOT / "scripts"))
            runpy.run_path(str(ROOT / command.entry), run_name="__main__")
        else:
            runpy.run_module(command.entry, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def _no_model(*args, **kwargs):
    raise AssertionError("a model loaded before the output place was checked")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # runpy: the module was imported before it runs as __main__
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join([c.entry, *c.argv[:1]]))
def test_an_output_place_it_must_refuse_is_one_line_before_any_model_loads(command, checkpoints, tmp_path,
                                                                           monkeypatch, capsys):
    monkeypatch.setattr(models, "_load", _no_model)
    monkeypatch.setattr(synthetic, "build", _no_model)
    monkeypatch.setenv("MOT_VIZ_CACHE", str(tmp_path / "cache"))
    checkpoint = str(checkpoints["smollm2-to-gemma3"])
    root = tmp_path / "place"
    root.mkdir()
    for case, out, words in places(command.kind, root):
        before = tree(root)
        argv = [a.format(out=out, ck=checkpoint) for a in command.argv]
        status = run(command, argv, monkeypatch)
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert status == 2 and len(lines) == 1, (case, status, lines[-5:])
        assert lines[0].startswith("error: ") and words in lines[0], (case, lines[0])
        assert re.search(r"\b(Pass|Choose)\b", lines[0]), (case, lines[0])  # the fix
        assert tree(root) == before, case  # the user's files byte-identical, nothing left behind
        assert not (READ_ONLY / "mot-viz-contract").exists()


def test_a_report_part_keeps_every_byte_outside_itself(tmp_path):
    """gpu_check's --out: a user's notes before the first heading, another part, odd line ends and a file without a
    final newline all stay byte for byte; only the command's own part is written (again)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from gpu_check_synthetic import write_part
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    out = tmp_path / "gpu.md"
    head = "My notes, before any heading.\r\n\n  indented\n"
    other = "# The GPU check\n\nThe real-weights part.\n\n## a section\n\ntext without a final newline"
    out.write_text(head + other, newline="")
    write_part(out, "# Synthetic", ["", "first"])
    assert out.read_bytes() == (head + other + "\n\n# Synthetic\n\nfirst\n").encode()
    write_part(out, "# Synthetic", ["", "second"])  # its own part replaced, the rest as it was
    assert out.read_bytes() == (head + other + "\n\n# Synthetic\n\nsecond\n").encode()
    write_part(out, "# The GPU check", ["", "again"])  # a part in the middle: what follows it stays too
    assert out.read_bytes() == (head + "# The GPU check\n\nagain\n\n# Synthetic\n\nsecond\n").encode()
    bare = tmp_path / "bare.md"
    bare.write_text("no heading at all\n")
    write_part(bare, "# Synthetic", ["", "x"])
    assert bare.read_text() == "no heading at all\n\n# Synthetic\n\nx\n"


def test_swap_into_place_removes_only_what_the_new_folder_replaces(tmp_path):
    from mot_viz.engine.checkpoint import swap_into_place
    from mot_viz.errors import ConfigError

    def new_folder() -> Path:
        tmp = tmp_path / f"out.tmp-{len(list(tmp_path.iterdir()))}"
        tmp.mkdir()
        (tmp / "config.json").write_text("new")
        return tmp

    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("old")
    (out / "notes.txt").write_text("a user's notes")
    for target, words in ((out, "holds files it did not write (notes.txt)"), (tmp_path / "file", "is a file")):
        (tmp_path / "file").write_text("a user's file")
        before = tree(tmp_path)
        tmp = new_folder()
        with pytest.raises(ConfigError, match=re.escape(words)):
            swap_into_place(tmp, target)
        assert tree(tmp_path) == before  # the temporary folder gone, the user's files as they were
    tmp = new_folder()
    swap_into_place(tmp, out, overwrite=True)  # a user's --overwrite
    assert tree(out) == {"config.json": b"new"} and not tmp.exists()
    swap_into_place(new_folder(), out)  # the same names: an earlier write of the command's own
    assert tree(out) == {"config.json": b"new"}


def test_a_bundle_that_fails_leaves_no_temporary_archive(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bundle
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from mot_viz.errors import ConfigError

    monkeypatch.setattr(bundle, "gather_wheels", lambda python, folders, out: ([], []))
    monkeypatch.setattr(bundle, "LIMIT_MB", 0)  # the archive is written, then refused as too large
    out = tmp_path / "dist" / "bundle.tar.gz"
    with pytest.raises(ConfigError, match="over its 0 MB limit"):
        bundle.build(out, (3, 12), [], tmp_path / "work")
    assert not list(out.parent.iterdir())
    monkeypatch.setattr(bundle, "code_files", lambda: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        bundle.build(out, (3, 12), [], tmp_path / "work")
    assert not list(out.parent.iterdir())
    monkeypatch.setattr(bundle, "LIMIT_MB", 60)
    monkeypatch.setattr(bundle, "code_files", lambda: [])
    bundle.build(out, (3, 12), [], tmp_path / "work")
    assert bundle.is_bundle(out)  # an earlier bundle: a later run replaces it without --overwrite
    (tmp_path / "notes.tar.gz").write_bytes(b"")
    assert not bundle.is_bundle(tmp_path / "notes.tar.gz") and not bundle.is_bundle(tmp_path / "dist")
