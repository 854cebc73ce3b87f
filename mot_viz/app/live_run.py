"""A live evaluation from the app: ``python -m mot_viz.eval.evaluate`` run in a subprocess of its own process group
(the page's session keeps it), its progress read from its progress bar in a log file, stopped by SIGINT — the command
then writes what it computed, and ``--resume`` continues it — with its results in a folder of the user cache named so
that runs never collide; and the check of an uploaded JSONL file of examples, as the command reads it. No Streamlit:
the Evaluations page draws the widgets."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..data.eval_data import BUILTIN_DATASETS, load_dataset
from ..engine.model_cache import cache_dir
from ..errors import ConfigError, DataFormatError
from ..eval.answers import MAX_NEW_TOKENS
from ..eval.evaluate import check_settings
from ..eval.qa_settings import EvalSettings
from ..eval.policy import with_always
from ..sharing import registry
from ..sharing.checkpoints import checked_config
from .settings import REPO_ROOT

MAX_EXAMPLES = 50  # the most examples a live run evaluates (the app is for looking; a full run is the command's)
MAX_UPLOAD_BYTES = 8 * 2**20  # an uploaded JSONL file's limit (1,000 SQuAD examples are about 1 MB)
DATASETS = BUILTIN_DATASETS  # what the command evaluates offline; an uploaded .jsonl file besides
# the command's conditions a live run offers: those whose options all have a default (a direct map is a second
# checkpoint the page does not ask for)
LIVE_CONDITIONS = registry.names(lambda m: all(o.default is not None for o in m.options),
                                 registry.choices("evaluate"))
CONTEXT_TOKENS = 448  # the command's --max_context_tokens
LOG_SUFFIX = ".log"  # the command's output, beside its results folder (a results folder holds results only)
# tqdm's bar as the command prints it: "evaluate:  40%|████      | 2/5 [00:03<00:04, …]"
_BAR = re.compile(r"evaluate:[^\r\n]*?\|\s*(\d+)/(\d+)")


def runs_dir() -> Path:
    """Where live runs write: <user cache>/runs (mot_viz.engine.model_cache.cache_dir)."""
    return cache_dir() / "runs"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "data"


def new_folder(checkpoint: str, dataset: str, n: int, root: Path | None = None) -> Path:
    """A new, empty results folder under `root` (default runs_dir()): <time>-<checkpoint>-<dataset>-n<n>, with -2,
    -3 … when that name is taken (made here, so two runs never share one)."""
    root = runs_dir() if root is None else Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = f"{stamp}-{_slug(Path(checkpoint.rstrip('/')).name)}-{_slug(Path(dataset).stem)}-n{n}"
    for k in range(1, 10_000):
        folder = root / (base if k == 1 else f"{base}-{k}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise ConfigError(f"{root} holds 9,999 runs named {base}: delete some, or set MOT_VIZ_CACHE to another folder.")


def check_upload(name: str, data: bytes, root: Path | None = None) -> Path:
    """An uploaded file of examples checked as the command reads a .jsonl dataset, and saved where a run reads it:
    <root>/uploads/<content digest>/<name>.jsonl (root: runs_dir()). One DataFormatError, with the fix, for a file too
    large, binary, not UTF-8, or with any malformed line (the command would skip those: here they are named)."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise DataFormatError(f"{name} is {len(data) / 2**20:.1f} MiB; a live run reads at most "
                              f"{MAX_UPLOAD_BYTES // 2**20} MiB ({MAX_EXAMPLES} examples are far less). Upload the "
                              "examples to evaluate only, or run python -m mot_viz.eval.evaluate --datasets "
                              "FILE.jsonl.")
    if b"\0" in data:
        raise DataFormatError(f"{name} is a binary file, not JSONL text. Upload a .jsonl file: one JSON object per "
                              'line, {"context", "question", "answers": [...]} or {"context", "question", '
                              '"choices": [...], "label": int}.')
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataFormatError(f"{name} is not UTF-8 text (byte {exc.start}). Save it as UTF-8 JSONL.") from exc
    root = runs_dir() if root is None else Path(root)
    path = root / "uploads" / hashlib.sha256(data).hexdigest()[:16] / f"{_slug(Path(name).stem)}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    try:
        load_dataset(str(path), strict=True)
    except DataFormatError as exc:
        path.unlink(missing_ok=True)  # a refused file is not kept
        with contextlib.suppress(OSError):  # its folder, unless another upload of the same bytes fills it
            path.parent.rmdir()
        raise DataFormatError(str(exc).replace(str(path), name)) from exc
    return path


@dataclass(frozen=True)
class Progress:
    """How far a live run is: examples done of its total, and what it does now."""

    done: int
    total: int
    phase: str  # "starting", "evaluating", "finished", "stopped" or "failed"
    message: str = ""  # the command's error line when it failed

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


@dataclass
class LiveRun:
    """One run of the evaluate command: its settings, results folder, log and process."""

    settings: EvalSettings
    folder: Path
    process: subprocess.Popen
    stopped: bool = False

    @property
    def log(self) -> Path:
        return self.folder.with_name(self.folder.name + LOG_SUFFIX)

    @property
    def command(self) -> str:
        """The command line that reproduces the run (writing to its folder)."""
        return self.settings.command(self.folder)

    def running(self) -> bool:
        return self.process.poll() is None

    def progress(self) -> Progress:
        """Read from the command's progress bar in its log: its last count, plus the examples a resumed run kept."""
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        bars = _BAR.findall(text)
        n = self.settings.n
        done = n - int(bars[-1][1]) + int(bars[-1][0]) if bars else 0  # the bar counts the examples still to do
        code = self.process.poll()
        if code is None:
            return Progress(done, n, "evaluating" if bars else "starting")
        if code == 0:
            return Progress(n, n, "finished")
        if self.stopped:
            return Progress(done, n, "stopped")
        errors = [line for line in text.splitlines() if line.startswith("error: ")]
        lines = [line for line in text.splitlines() if line.strip()]
        message = errors[-1] if errors else (lines[-1] if lines else f"exit status {code}")
        return Progress(done, n, "failed", message)

    def stop(self) -> None:
        """Ctrl-C, as a user at a terminal would: the command writes what it computed and exits."""
        if self.running():
            self.stopped = True
            os.killpg(self.process.pid, signal.SIGINT)

    def wait(self) -> int:
        """Until the process exits; its exit status (0 done, 130 stopped, 2 a user error)."""
        return self.process.wait()


def settings_for(checkpoint: str, dataset: str, n: int, conditions, *, seed: int = 0,
                 max_new_tokens: int = MAX_NEW_TOKENS, max_context_tokens: int | None = None) -> EvalSettings:
    """The evaluate command's settings of a live run, checked as the command checks them before it loads a model
    (ConfigError, CheckpointError), and n, the dataset and the conditions as a live run takes them (ConfigError).
    The defaults are the command's; max_context_tokens's (448) is cut to half the target's positions for a model
    that reads fewer than 896 (so the question and the answer fit beside the passage)."""
    if not 1 <= n <= MAX_EXAMPLES:
        raise ConfigError(f"a live run evaluates 1 to {MAX_EXAMPLES} examples, got {n}. For more, run the command "
                          "shown below in a terminal.")
    if dataset not in DATASETS and not dataset.endswith(".jsonl"):
        raise ConfigError(f"dataset {dataset!r} is not one the command reads offline: {', '.join(DATASETS)}, or "
                          "an uploaded .jsonl file.")
    unknown = [c for c in conditions if c not in LIVE_CONDITIONS]
    if unknown:
        raise ConfigError(f"unknown condition(s) {', '.join(unknown)}: choose among {', '.join(LIVE_CONDITIONS)}.")
    chosen = with_always("evaluate", conditions)  # as the command orders
    if max_context_tokens is None:
        limit = checked_config("--checkpoint", checkpoint)["target"].get("max_positions") or 2 * CONTEXT_TOKENS
        max_context_tokens = min(CONTEXT_TOKENS, limit // 2)
    settings = EvalSettings(checkpoint, None, (dataset,), n, seed, max_new_tokens, max_context_tokens, 1000, chosen)
    check_settings(settings)
    return settings


def start(settings: EvalSettings, folder: Path, resume: bool = False) -> LiveRun:
    """Start the evaluate command of `settings` writing to `folder` (an empty one from new_folder, or a stopped run's
    with `resume`), in its own process group, its output in the log beside the folder. The command is exactly the one
    LiveRun.command shows (plus --resume)."""
    argv = shlex.split(settings.command(folder))
    if argv[argv.index("--out") + 1] != str(folder) or argv[argv.index("--checkpoint") + 1] != settings.checkpoint:
        raise ConfigError(f"the checkpoint path {settings.checkpoint!r} or the results folder {folder} holds a space "
                          "or a quote, which the command line cannot carry here. Use a path without them.")
    argv = [sys.executable, *argv[1:], *(["--resume"] if resume else [])]
    log = folder.with_name(folder.name + LOG_SUFFIX)
    with log.open("ab") as out:  # the child holds its own descriptor
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=REPO_ROOT, start_new_session=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return LiveRun(settings, folder, process)
