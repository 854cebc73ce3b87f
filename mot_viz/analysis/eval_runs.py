"""Evaluation results folders as tables: a run's settings and summary, one row per example, the summary of any
slice of its examples, and two runs of the same examples compared example by example.

Opens every folder the evaluations write with ``--out`` (``python -m mot_viz.eval.evaluate``, ``long_context``,
``conversation``, ``shards``); what kind a folder holds is read from its examples.csv header, which each writer
fixes (its ``ROW_COLUMNS``). The numbers come from the writers' own code: a slice is summarised by the writer's
``summarize`` (so the whole run's slice is the folder's own summary), two runs are compared by
``mot_viz.eval.report.paired_differences`` (as ``scripts/paired_runs.py`` does). Pure functions: no Streamlit.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..data.coqa import _conversations
from ..data.eval_data import load_dataset
from ..data.long_context import _qasper_docs
from ..engine.checkpoint import read_config
from ..errors import DataFormatError, MotVizError
from ..eval import conversation, evaluate, long_context, shards
from ..eval.long_settings import LongSettings
from ..eval.qa_settings import EvalSettings
from ..eval.report import paired_differences, summarize
from ..eval.results_folder import HEAD_BYTES, RESULTS_TABLE, SETTINGS_FILE, binary_start, table_text
from ..fsutil import checkout_path, short_path
from ..sharing.registry import REFERENCE, TRANSLATED

RIGHT = 0.5  # a score at least this is "right" (F1 ≥ 0.5, or a closed question answered): the lost-answer filter
REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_TABLE_BYTES = 256 * 2**20  # the largest examples.csv read: far more than evaluations write, far less than memory


class ResultsFolderError(DataFormatError):
    """A folder that is not an evaluation's results folder, or one whose files are damaged."""

    title = "Results folder problem"


@dataclass(frozen=True)
class RunKind:
    """One evaluation command's results folder: its table's columns, what one example is, and how it is summarised."""

    name: str  # the evaluation module: "evaluate", "long_context", "conversation", "shards"
    headers: tuple[tuple[str, ...], ...]  # the examples.csv headers it writes (the current first) and resumes
    text_columns: tuple[str, ...]  # read as text, as --resume reads them
    unit: tuple[str, ...]  # the columns that name one example (a row per condition each)
    group: Callable[[pd.DataFrame], pd.Series]  # the summary's group of each row (as the writer's paired.csv names it)
    translated: str  # the condition whose score − native's is "MoT − native"
    settings: type  # the settings dataclass summary.json stores (from_json, command)
    # what the commands run after an evaluation add to its folder, and so what the Evaluations page can show of it
    layer_errors: bool = False  # python -m mot_viz.eval.layer_error records each example's per-layer cache error
    patching: bool = False  # python -m mot_viz.eval.patching scans its examples (patching.csv)
    patching_per_budget: bool = False  # one scan covers one budget's documents (--budget): a folder of several lengths

    @property
    def command(self) -> str:
        return f"python -m mot_viz.eval.{self.name}"


def kinds_text(what: Callable[[RunKind], bool]) -> str:
    """The kinds of folder that `what` holds of, as their commands are named in a caption: "`evaluate` and
    `long_context`"."""
    names = [f"`{kind.name}`" for kind in KINDS if what(kind)]
    return f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else "".join(names)


def _budget_label(source: pd.Series, budget: pd.Series) -> pd.Series:
    return source.astype(str) + " " + budget.astype(str) + " tokens"


KINDS = (
    RunKind("evaluate", (evaluate.ROW_COLUMNS, *evaluate.RESULTS.earlier), evaluate.TEXT_COLUMNS,
            ("dataset", "id"), lambda rows: rows["dataset"].astype(str), TRANSLATED, EvalSettings,
            layer_errors=True, patching=True),
    RunKind("long_context", (long_context.ROW_COLUMNS, *long_context.RESULTS.earlier), long_context.TEXT_COLUMNS,
            ("source", "budget", "id"), lambda rows: _budget_label(rows["source"], rows["budget"]), TRANSLATED,
            LongSettings, layer_errors=True, patching=True, patching_per_budget=True),
    RunKind("conversation", (conversation.ROW_COLUMNS, *conversation.RESULTS.earlier), conversation.TEXT_COLUMNS,
            ("id", "turn"), lambda rows: "turn " + rows["turn"].astype(str), TRANSLATED,
            conversation.ConversationSettings),
    RunKind("shards", (shards.ROW_COLUMNS, *shards.RESULTS.earlier), shards.TEXT_COLUMNS, ("budget", "id"),
            lambda rows: _budget_label(pd.Series("stacks", index=rows.index), rows["budget"]), "whole",
            shards.ShardSettings),
)


@dataclass
class EvalRun:
    """One results folder, read: the run's settings and summary as summary.json states them, and its examples."""

    folder: Path
    kind: RunKind
    settings: dict  # summary.json's "settings", as written
    meta: dict  # the whole of summary.json
    summary: pd.DataFrame  # summary.json's "summary": one row per group and condition, as the run wrote it
    rows: pd.DataFrame  # examples.csv (skipped rows dropped), plus "group" and "example" (one example's name)
    skipped: pd.DataFrame  # the examples a model could not hold, with the reason
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def conditions(self) -> list[str]:
        return list(dict.fromkeys(self.rows["condition"]))

    @property
    def translated(self) -> str:
        return self.kind.translated

    @property
    def command(self) -> str:
        """The command that wrote this folder."""
        return self.kind.settings.from_json(self.settings).command(self.folder)


# ----- reading a folder ------------------------------------------------------------------------------------------


def _refuse(folder: Path, what: str) -> ResultsFolderError:
    return ResultsFolderError(
        f"{short_path(folder)} {what}. Pick a folder that `python -m mot_viz.eval.evaluate`, `long_context`, "
        "`conversation` or `shards` wrote with --out (it holds examples.csv and summary.json), e.g. "
        "results/eval/smollm2-to-gemma3-mid-squad300.")


def _read_table(folder: Path) -> tuple[RunKind, pd.DataFrame]:
    path = folder / RESULTS_TABLE
    size = path.stat().st_size
    if size > MAX_TABLE_BYTES:
        raise ResultsFolderError(
            f"{short_path(path)} is {size / 2**20:,.0f} MiB; results tables are read up to "
            f"{MAX_TABLE_BYTES // 2**20} MiB (an evaluation of 300 examples writes under 0.5 MiB), so it is not "
            "one an evaluation wrote. Pick the folder an evaluation's --out wrote.")
    with path.open("rb") as handle:  # binary data is told from the file's start, before it is read whole
        if binary_start(handle.read(HEAD_BYTES)):
            raise _refuse(folder, f"holds a binary {RESULTS_TABLE}, not the table an evaluation writes")
        handle.seek(0)
        text = table_text(handle.read())
    if text is None:
        raise _refuse(folder, f"holds a binary {RESULTS_TABLE}, not the table an evaluation writes")
    header = text.split("\n", 1)[0].rstrip("\r").split(",")
    kind = next((k for k in KINDS if tuple(header) in k.headers), None)
    if kind is None:
        raise _refuse(folder, f"holds an {RESULTS_TABLE} with the columns {', '.join(header[:8])}…, which no "
                              "evaluation of MoT Viz writes")
    if not text.endswith("\n"):  # the writers end every row with a newline: this one was cut short
        raise ResultsFolderError(
            f"{path} is cut short (its last row ends without a newline): the run that wrote it was stopped, or the "
            f"file was damaged since. Complete it with `{kind.command} … --out {folder} --resume`, which recomputes "
            "the examples without a whole row.")
    try:
        rows = pd.read_csv(io.StringIO(text), dtype=dict.fromkeys(kind.text_columns, str), keep_default_na=False,
                           na_values=[""], float_precision="round_trip")
    except (ValueError, pd.errors.ParserError) as exc:
        raise ResultsFolderError(f"{path} cannot be read as results ({exc}). Run the evaluation again with --out "
                                 f"{folder} --resume to rewrite it.") from exc
    scored = rows[rows["condition"] != "skipped"]
    bad = scored[pd.to_numeric(scored["score"], errors="coerce").isna()]
    if len(bad):
        raise ResultsFolderError(
            f"{path} has {len(bad)} row(s) without a numeric score (the first: example {bad['id'].iloc[0]!r}): the "
            f"file was edited or damaged. Run the evaluation again with --out {folder} --resume to rewrite it.")
    return kind, rows


def open_run(folder: str | Path) -> EvalRun:
    """Read a results folder. Raises ResultsFolderError (one line, with the fix) for a missing folder, one that is
    not a results folder, or one whose examples.csv or summary.json is torn, foreign or unreadable."""
    folder = Path(folder).expanduser()
    try:
        exists = folder.exists()
    except (OSError, ValueError) as exc:  # a name too long for the system, a NUL in it
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ResultsFolderError(f"{short_path(folder)} cannot be a folder's path ({why}). Type the path of a "
                                 "results folder, e.g. results/eval/smollm2-to-gemma3-mid-squad300.") from exc
    if not exists:
        raise ResultsFolderError(f"There is no folder {short_path(folder)}. Type the path of a results folder "
                                 f"(absolute, or relative to {Path.cwd()}), e.g. "
                                 "results/eval/smollm2-to-gemma3-mid-squad300.")
    if not folder.is_dir():
        raise _refuse(folder, "is a file, not a folder")
    missing = [name for name in (RESULTS_TABLE, SETTINGS_FILE) if not (folder / name).is_file()]
    if missing:
        raise _refuse(folder, f"has no {' and no '.join(missing)}, so it is not a results folder")
    try:
        kind, rows = _read_table(folder)
        meta = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8"))
    except OSError as exc:
        raise _refuse(folder, f"cannot be read ({exc.strerror})") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _refuse(folder, f"holds a {SETTINGS_FILE} that is not JSON ({exc})") from exc
    try:
        kind.settings.from_json(meta["settings"])
        summary = pd.DataFrame(meta["summary"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _refuse(folder, f"holds a {SETTINGS_FILE} without the settings and summary its evaluation writes "
                              f"({type(exc).__name__}: {exc})") from exc
    skipped = rows[rows["condition"] == "skipped"]
    rows = rows[rows["condition"] != "skipped"].reset_index(drop=True)
    if rows.empty:
        why = f" (the first skipped: {skipped['error'].iloc[0]})" if len(skipped) else ""
        raise ResultsFolderError(f"{folder} holds no scored example yet: {len(skipped)} skipped{why}. Run the "
                                 f"evaluation with other settings, or with --out {folder} --resume to continue it.")
    rows["group"] = kind.group(rows)
    rows["example"] = _example_names(kind, rows)
    return EvalRun(folder, kind, meta["settings"], meta, summary, rows,
                   skipped[[c for c in (*kind.unit, "error") if c in skipped]].reset_index(drop=True))


def _example_names(kind: RunKind, rows: pd.DataFrame) -> pd.Series:
    """One name per example, unique within the run: the id (ids of long documents name their length already), or
    for a conversation its id and turn."""
    if kind.name == "conversation":
        return rows["id"] + " turn " + rows["turn"].astype(int).astype(str)
    if kind.name == "evaluate" and rows["dataset"].nunique() > 1:
        return rows["dataset"] + " " + rows["id"]
    return rows["id"].astype(str)


# ----- one row per example ---------------------------------------------------------------------------------------


def questions(run: EvalRun) -> dict[str, str]:
    """The question of each example (by its name in run.rows["example"]), from the installed data the run sampled;
    examples whose data is not installed here (a .jsonl moved away) have none."""
    out: dict[str, str] = {}
    names = run.rows.drop_duplicates("example")
    try:
        if run.kind.name == "evaluate":
            for name in run.settings.get("datasets", []):
                for e in load_dataset(name, n=run.settings["n"], seed=run.settings["seed"]):
                    out[(e.dataset, e.id)] = e.question
            return {r.example: out[(r.dataset, r.id)] for r in names.itertuples() if (r.dataset, r.id) in out}
        if run.kind.name == "conversation":
            stories = {c.id: c for c in _conversations()}
            return {r.example: stories[r.id].turns[int(r.turn) - 1].question for r in names.itertuples()
                    if r.id in stories and int(r.turn) <= len(stories[r.id].turns)}
        source = run.settings.get("source", "stacks")
        if source == "qasper":
            by_id = {d["id"]: d["question"].strip() for d in _qasper_docs()}
            return {r.example: by_id[r.id.rsplit("-", 1)[0]] for r in names.itertuples()
                    if r.id.rsplit("-", 1)[0] in by_id}
        if source == "stacks":  # a stack's id is its SQuAD question's, its budget and its depth
            by_id = {e.id: e.question for e in load_dataset("squad")}
            return {r.example: by_id[r.id.rsplit("-", 2)[0]] for r in names.itertuples()
                    if r.id.rsplit("-", 2)[0] in by_id}
        by_id = {e.id: e.question for e in load_dataset(source)}  # a user's .jsonl keeps its ids
        return {r.example: by_id[r.id] for r in names.itertuples() if r.id in by_id}
    except (MotVizError, OSError, ValueError):  # the data is not installed here: no questions, the rest stands
        return {}


def wide_table(run: EvalRun, asked: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per example: its group, id, dataset or genre, context tokens, evidence depth where the run knows it,
    the question (`asked`, default questions(run)), the gold answer, each condition's answer and score, and
    "MoT − native" (the run's translated condition's score minus native's)."""
    rows, kind = run.rows, run.kind
    first = rows.drop_duplicates("example").set_index("example")
    out = pd.DataFrame(index=first.index)
    out["group"] = first["group"]
    out["id"] = first["id"]
    if kind.name == "conversation":
        out["turn"] = first["turn"].astype(int)
    out["dataset"] = {"evaluate": first.get("dataset"), "long_context": first.get("source"),
                      "conversation": first.get("genre"),
                      "shards": pd.Series("stacks", index=first.index)}[kind.name]
    tokens = {"evaluate": "context_tokens", "long_context": "context_tokens", "conversation": "story_tokens",
              "shards": "hub_tokens"}[kind.name]
    out["context_tokens"] = first[tokens].astype(float)
    if "depth" in first:
        out["depth"] = first["depth"]
        out["evidence_fraction"] = first["evidence_fraction"].astype(float)
    asked = questions(run) if asked is None else asked
    out["question"] = pd.Series(asked, dtype=object).reindex(out.index)
    out["gold"] = first["gold"]
    answers = rows.pivot(index="example", columns="condition", values="answer")
    scores = rows.pivot(index="example", columns="condition", values="score").astype(float)
    for condition in run.conditions:
        out[f"{condition} answer"] = answers[condition].reindex(out.index)
        out[f"{condition} score"] = scores[condition].reindex(out.index)
    if {REFERENCE, run.translated} <= set(run.conditions):
        out[delta_column(run)] = out[f"{run.translated} score"] - out[f"{REFERENCE} score"]
    return out.reset_index()


def delta_column(run: EvalRun) -> str:
    return f"{run.translated} − {REFERENCE}"


def select(table: pd.DataFrame, condition: str, low: float = 0.0, high: float = 1.0, lost: bool = False,
           search: str = "", translated: str = TRANSLATED) -> pd.DataFrame:
    """The rows of a wide table whose `condition` score lies in [low, high], only those native answered right and
    `translated` wrong when `lost` (right: a score of at least RIGHT), and whose question contains `search` (any
    case; no question known: no match)."""
    keep = table[f"{condition} score"].between(low, high)
    if lost:
        keep &= (table[f"{REFERENCE} score"] >= RIGHT) & (table[f"{translated} score"] < RIGHT)
    if search.strip():
        keep &= table["question"].fillna("").str.contains(search.strip(), case=False, regex=False)
    return table[keep]


# ----- summaries of a slice --------------------------------------------------------------------------------------

# the evaluator names the share of native kept "retained", the other evaluations "retention"
_RETAINED = {"retained": "retention", "retained_ci_low": "retention_ci_low", "retained_ci_high": "retention_ci_high"}
SLICE_COLUMNS = ("group", "condition", "n", "mean", "ci_low", "ci_high", "retention", "retention_ci_low",
                 "retention_ci_high")


def _summarize(run: EvalRun, rows: pd.DataFrame) -> pd.DataFrame:
    """The writer's own summary of `rows` (its columns), with its bootstrap settings."""
    n_boot, seed = run.settings.get("bootstrap", 1000), run.settings.get("seed", 0)
    if run.kind.name == "evaluate":
        return summarize(rows, n_boot, seed, run.settings.get("relay_tokens")).rename(columns=_RETAINED)
    if run.kind.name == "long_context":
        return long_context.summarize(rows, n_boot, seed, run.settings.get("relay_tokens"))
    if run.kind.name == "conversation":
        sizes = run.meta.get("sizes") or {}
        return conversation.summarize(rows, sizes.get("target_mb_per_token", np.nan),
                                      sizes.get("source_mb_per_token", np.nan), sizes.get("translator_mb", np.nan),
                                      n_boot, seed)
    return shards.summarize(rows, tuple(run.settings["shards"]), n_boot, seed, tuple(run.settings.get("sharing", ())))


def slice_summary(run: EvalRun, examples: Iterable[str] | None = None) -> pd.DataFrame:
    """Each group's and condition's mean score with its 95% bootstrap interval and the share of native kept
    (retention, with its paired interval), over the examples named (default: all), computed by the writer's own
    summary (mot_viz.eval.report.summarize, long_context, conversation or shards.summarize): over every example it
    is the folder's own summary."""
    rows = run.rows if examples is None else run.rows[run.rows["example"].isin(set(examples))]
    if rows.empty:
        return pd.DataFrame(columns=SLICE_COLUMNS)
    summary = _summarize(run, rows.drop(columns=["group", "example"]))
    return _as_slice(run, summary)


def stated_summary(run: EvalRun) -> pd.DataFrame:
    """The folder's own summary (summary.json) in slice_summary's columns."""
    return _as_slice(run, run.summary.rename(columns=_RETAINED))


def _as_slice(run: EvalRun, summary: pd.DataFrame) -> pd.DataFrame:
    groups = {"evaluate": lambda s: s["dataset"], "long_context": lambda s: _budget_label(s["source"], s["budget"]),
              "conversation": lambda s: "turn " + s["turn"].astype(int).astype(str),
              "shards": lambda s: pd.Series(f"stacks {run.settings['budget']} tokens", index=s.index)}
    out = summary.assign(group=groups[run.kind.name](summary))
    for column in SLICE_COLUMNS:
        if column not in out:
            out[column] = np.nan
    return out[list(SLICE_COLUMNS)].reset_index(drop=True)


# ----- two runs of the same examples ----------------------------------------------------------------------------


def model_pair(run: EvalRun) -> tuple[str, str] | None:
    """The (source, target) models of the run's checkpoint, as its config.json names them (the path as the run gave
    it, or from the repository); None where that checkpoint is not here."""
    checkpoint = run.settings.get("checkpoint")
    if not checkpoint:
        return None
    try:
        config = read_config(checkout_path(checkpoint))
        return str(config["source"]["name"]), str(config["target"]["name"])
    except (MotVizError, OSError, KeyError, TypeError, ValueError):
        return None


def check_one_pair(runs: Iterable[EvalRun]) -> None:
    """Raise ResultsFolderError unless the runs (those whose checkpoint is here) are of one model pair: a paired
    difference compares answers to the same prompts, and another target answers other ones (its native differs)."""
    pairs = {run.folder: pair for run in runs if (pair := model_pair(run)) is not None}
    if len(set(pairs.values())) > 1:
        shown = "; ".join(f"{folder.name}: {source} → {target}" for folder, (source, target) in pairs.items())
        raise ResultsFolderError(f"These runs are of different model pairs ({shown}), so their answers are not to "
                                 "the same prompts. Compare runs of one pair (the same source and target models).")


def condition_rows(run: EvalRun, condition: str, label: str) -> pd.DataFrame:
    """One condition's rows of a run renamed `label`, with "dataset" naming each row's group (as the run's own
    paired.csv does): what mot_viz.eval.report.paired_differences compares across runs."""
    part = run.rows[run.rows["condition"] == condition]
    if part.empty:
        raise ResultsFolderError(f"{run.folder} has no rows of condition {condition!r}; it has "
                                 f"{', '.join(run.conditions)}. Pick one of those.")
    return part.assign(condition=label, dataset=part["group"], id=part["example"])


@dataclass
class RunComparison:
    """Two runs' scores of the same examples under one condition each."""

    labels: tuple[str, str]  # the two runs' labels in `pairs` and `paired`
    pairs: pd.DataFrame  # one row per example both ran: example, group, score_a, score_b, diff (a − b)
    a_wins: pd.DataFrame  # the rows of `pairs` where a scores higher
    b_wins: pd.DataFrame
    paired: pd.DataFrame  # paired_differences: per group, mean of a − b with its 95% interval and the wins


def compare_runs(a: EvalRun, b: EvalRun, condition_a: str | None = None, condition_b: str | None = None,
                 examples: Iterable[str] | None = None, n_boot: int = 1000, seed: int = 0) -> RunComparison:
    """Per example, run a's score under condition_a against run b's under condition_b (default: each run's
    translated condition), over the examples both ran (and among `examples` when given), and the paired difference
    a − b per group with its bootstrap interval: mot_viz.eval.report.paired_differences, as scripts/paired_runs.py
    computes it. A pair of runs with no example in common, or of two model pairs (check_one_pair), is a
    ResultsFolderError."""
    check_one_pair((a, b))
    condition_a, condition_b = condition_a or a.translated, condition_b or b.translated
    label_a, label_b = a.name, b.name if b.name != a.name else f"{b.name} (second)"
    rows_a, rows_b = condition_rows(a, condition_a, label_a), condition_rows(b, condition_b, label_b)
    if examples is not None:
        chosen = set(examples)
        rows_a, rows_b = rows_a[rows_a["example"].isin(chosen)], rows_b[rows_b["example"].isin(chosen)]
    pairs = rows_a[["example", "group", "score"]].merge(rows_b[["example", "group", "score"]], on=["example", "group"],
                                                         suffixes=("_a", "_b"))
    if pairs.empty and examples is None:
        raise ResultsFolderError(f"{a.folder} and {b.folder} have no example in common (the same dataset, n and "
                                 "seed give the same examples). Pick a second run of the same examples.")
    pairs["diff"] = pairs["score_a"] - pairs["score_b"]
    paired = paired_differences(pd.concat([rows_a, rows_b]), pairs=[(label_a, label_b)], n_boot=n_boot, seed=seed) \
        if len(pairs) else pd.DataFrame(columns=["dataset", "a", "b", "n", "diff", "ci_low", "ci_high", "a_better",
                                                 "b_better"])
    return RunComparison((label_a, label_b), pairs, pairs[pairs["diff"] > 0], pairs[pairs["diff"] < 0], paired)


def shipped_runs(root: str | Path = REPO_ROOT / "results") -> list[Path]:
    """The results folders under `root` (those holding examples.csv and summary.json), sorted; none when there is
    no such folder (an installed copy without the repository's results)."""
    root = Path(root)
    return sorted(p.parent for p in root.glob(f"*/*/{RESULTS_TABLE}") if (p.parent / SETTINGS_FILE).is_file())
