"""The prepared GPU check: one command that proves MoT Viz's CUDA path on a machine with one GPU.

    .venv/bin/python scripts/gpu_check.py                                       # on cuda; writes benchmarks/gpu.md
    .venv/bin/python scripts/gpu_check.py --device cpu --quick --out /tmp/gpu.md    # the test suite's mode
    .venv/bin/python scripts/gpu_check.py --synthetic [--device cpu --quick]   # no model file, checkpoint or dataset

This is the real-weights part; `--synthetic` runs the part that needs only the code (scripts/gpu_check_synthetic.py:
synthetic models of real architectures, from the bundled pair's to 8B). Each part writes its own part of
benchmarks/gpu.md and keeps the other's.

What it checks, in order (one section of the table each):

1. **Same results as the CPU, float32.** The bundled pair (SmolLM2-135M -> Gemma-3-270m) and the shipped checkpoint
   (pretrained/smollm2-to-gemma3) are loaded on the device and on the CPU. On 5 SQuAD contexts (a seed-0 sample, cut
   to the evaluator's 448 tokens) it compares translate (the translated window's K and V), replay (the replayed
   target cache, every layer), answers (the log-probabilities of the first answer token after the native and the
   translated caches, and whether the greedy answers under native, mot and no context are the same text) and the
   logit lens (each layer's KL to native's final distribution, and the answer token's probability). Each tensor must
   equal the CPU's within RTOL = 1e-3 of the CPU value's scale (max |device - cpu| / max |cpu|: the rule of
   tests/tolerance.py); a greedy answer that differs is reported (a near-tie), not failed.
2. **bfloat16.** The same quantities computed under bfloat16 autocast on the device (what training's --autocast bf16
   does), against the CPU's float32: how far they move (reported, not checked), and how many greedy answers stay the
   same.
3. **Training.** The shipped recipe (configs/smollm2-to-gemma3.json: its bank, its linear map, its bank stage) with
   50 replay steps on the device, once uninterrupted and once stopped at step 25 and resumed: the resumed translator
   must equal the uninterrupted one (bit for bit on the CPU; within RTOL on a GPU, whose kernels may round
   differently from run to run).
4. **SQuAD evaluation.** 100 SQuAD examples under every condition, through the evaluator's own command
   (mot_viz.eval.evaluate.main) with the models on the device: its summary table and the seconds it took.
5. **Engine benchmark.** benchmarks/engine.py run on the device at 512-8,000 target tokens (its table: seconds per
   stage and the ratios to the native prefill), with CUDA_LAUNCH_BLOCKING=1 so its wall-clock timers time the kernels.

How long: sized to stay under 8 minutes on one GPU (not yet timed on one: the table's first line records each
section's seconds); --quick (2 contexts of 64 tokens, 2 training steps on a small bank, 1 example, the engine at 64
tokens) about 2 minutes on 2 idle CPU cores.
The exit status is 0 when every check of sections 1 and 3 passes, 1 otherwise; the table is written either way.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext, redirect_stderr
from dataclasses import dataclass, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if __name__ == "__main__" and "--synthetic" in sys.argv[1:]:
    # the synthetic part (scripts/gpu_check_synthetic.py) imports only the engine and training, which the code-only
    # bundle ships: it runs before the imports below, which the real-weights check needs (datasets, the evaluator)
    from gpu_check_synthetic import main as synthetic_main
    from mot_viz.cli import run_cli

    sys.exit(run_cli(synthetic_main))

from gpu_check_synthetic import RTOL, scale_error, stopped_and_resumed, write_part  # noqa: E402  (device vs CPU: one rule, one file)
from mot_viz.analysis.logit_lens import logit_lens, translation_lens_trace  # noqa: E402
from mot_viz.cli import run_cli  # noqa: E402
from mot_viz.data.eval_data import load_dataset  # noqa: E402
from mot_viz.engine.checkpoint import load_checkpoint, read_config  # noqa: E402
from mot_viz.engine.models import DEFAULT_SOURCE, DEFAULT_TARGET, DEVICE_VARIABLE, load_model, model_device  # noqa: E402
from mot_viz.engine.mot import empty_context_cache, translate  # noqa: E402
from mot_viz.engine.prompts import build_prompt  # noqa: E402
from mot_viz.eval import evaluate  # noqa: E402
from mot_viz.eval.answers import MAX_NEW_TOKENS, answers_from_caches, first_answer_logprobs  # noqa: E402
from mot_viz.eval.qa_settings import truncate_context  # noqa: E402
from mot_viz.errors import MotVizError  # noqa: E402
from mot_viz.fsutil import check_out_place, text_file  # noqa: E402
from mot_viz.sharing import registry  # noqa: E402
from mot_viz.sharing.method import Request  # noqa: E402
from mot_viz.train.config import parse_args  # noqa: E402

CHECKPOINT = "pretrained/smollm2-to-gemma3"
DIRECT = "pretrained/smollm2-to-gemma3-direct"  # the evaluator's "direct" condition reads it (--direct)
RECIPE = "configs/smollm2-to-gemma3.json"


@dataclass(frozen=True)
class Scale:
    """How much each section does: the full check, or --quick (the test suite's CPU mode)."""

    contexts: int  # SQuAD contexts compared with the CPU
    context_tokens: int  # each cut to at most this many target tokens (qa_settings.truncate_context)
    answer_tokens: int  # greedy answer tokens compared
    lens_tokens: int  # answer positions the logit lens follows
    train: dict  # overrides of the shipped recipe
    steps: int  # replay steps trained (stopped at half, resumed)
    examples: int  # SQuAD examples evaluated
    eval_args: tuple[str, ...]  # further evaluator flags
    lengths: tuple[int, ...]  # engine benchmark lengths, target tokens
    repeats: int  # engine benchmark repeats


FULL = Scale(5, 448, MAX_NEW_TOKENS, 8, {}, 50, 100, (), (512, 1024, 2048, 4096, 8000), 3)
QUICK = Scale(2, 64, 4, 1, dict(bank_tokens=320, bank_min_tokens=32, bank_max_tokens=64, bank_steps=2,
                                num_sequences=4, total_tokens=64, prefix_tokens=32, batch_size=1, save_every=1,
                                log_every=1),
              2, 1, ("--max_new_tokens", "4", "--max_context_tokens", "64", "--relay_tokens", "8", "--bootstrap", "20"),
              (64,), 1)
SECTIONS = ("Same results as the CPU (float32)", "bfloat16 against the CPU's float32", "Training and resume",
            "SQuAD evaluation", "Engine benchmark")


class Tee(io.TextIOBase):
    """A text stream writing to several (the evaluator's messages go on to stderr and are kept for the table)."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)


def context_results(mot, source, target, example, scale: Scale) -> dict:
    """What section 1 compares for one example: translate, replay, answers, logit lens (tensors, on the CPU)."""
    example = truncate_context(target, example, scale.context_tokens)
    prompt = build_prompt(example, target.chat_frame)
    tr = translate(mot, source, target, prompt.context_text)
    caches = {"native": tr.native_kv, "mot": tr.mixed_kv, "no_context": empty_context_cache(target)}
    first = first_answer_logprobs(target, [tr.native_kv, tr.mixed_kv], prompt.suffix_text)
    answers = answers_from_caches(target, caches, example, scale.answer_tokens)
    lens = logit_lens(target, translation_lens_trace(mot, source, target, tr, prompt.suffix_text,
                                                     answer_tokens=scale.lens_tokens)).layers
    flat = lambda kv: torch.cat([t.float().flatten().cpu() for layer in kv for t in layer])  # noqa: E731
    return {
        "translate": torch.cat([tr.translated.keys.float().flatten(), tr.translated.values.float().flatten()]).cpu(),
        "replay": flat(tr.mixed_kv),
        "answers": first.cpu(),
        "logit lens": torch.tensor(lens[["kl_to_native_final", "token_prob"]].to_numpy(dtype="float64")),
        "answer texts": {c: a.text for c, a in answers.items()},
    }


def load_pair(device: str):
    """The bundled pair in float32 on `device`, and the shipped checkpoint's MoT beside them."""
    source = load_model(DEFAULT_SOURCE, device=device)
    target = load_model(DEFAULT_TARGET, device=device)
    mot = load_checkpoint(ROOT / CHECKPOINT, source, target)[0]
    return mot, source, target


def compare_with_cpu(device: str, examples, scale: Scale) -> tuple[list[str], list[str], bool]:
    """Sections 1 and 2: table rows of the float32 comparison (and whether all pass) and of bfloat16's movement."""
    results, models = {}, {}
    for name, where in (("cpu", "cpu"), ("float32", device), ("bfloat16", device)):
        if name == "float32" and device == "cpu":
            results[name] = results["cpu"]  # one computation: its rows show the path ran, exactly equal
            continue
        if where not in models:
            models = {where: load_pair(where)}  # one pair in memory at a time
        amp = torch.autocast(torch.device(where).type, dtype=torch.bfloat16) if name == "bfloat16" else nullcontext()
        with torch.no_grad(), amp:
            results[name] = [context_results(*models[where], e, scale) for e in examples]
    del models
    rows32, rows16, ok = [], [], True
    for i, example in enumerate(examples):
        cpu = results["cpu"][i]
        for quantity in ("translate", "replay", "answers", "logit lens"):
            err32 = scale_error(results["float32"][i][quantity], cpu[quantity])
            passed = err32 <= RTOL
            ok &= passed
            rows32.append(f"| {example.id} | {quantity} | {err32:.2e} | {RTOL:.0e} | {'pass' if passed else 'FAIL'} |")
            err16 = scale_error(results["bfloat16"][i][quantity], cpu[quantity])
            rows16.append(f"| {example.id} | {quantity} | {err16:.2e} |")
        for name, rows in (("float32", rows32), ("bfloat16", rows16)):
            same = sum(results[name][i]["answer texts"][c] == t for c, t in cpu["answer texts"].items())
            total = len(cpu["answer texts"])
            if name == "float32":
                rows.append(f"| {example.id} | greedy answers equal | {same}/{total} | all | "
                            f"{'pass' if same == total else 'differs (a near-tie)'} |")
            else:
                rows.append(f"| {example.id} | greedy answers equal | {same}/{total} |")
    return rows32, rows16, ok


def train_and_resume(device: str, out: Path, scale: Scale) -> tuple[list[str], bool]:
    """Section 3: the shipped recipe trained uninterrupted, and stopped halfway then resumed, on the device."""
    base, _, _ = parse_args(["--config", str(ROOT / RECIPE)])
    steps = scale.steps
    cfg = replace(base, **{"save_every": 5, "log_every": 5, **scale.train}, max_steps=steps,
                  linear_from=str(ROOT / base.linear_from), device=device)
    source = load_model(cfg.source, device=device)
    target = load_model(cfg.target, device=device)
    seconds, rows, ok = stopped_and_resumed(cfg, out, device, source=source, target=target)
    return [f"| replay steps (after the recipe's bank stage of {cfg.bank_steps} steps) | {steps} |",
            f"| seconds, uninterrupted run (bank stage included) | {seconds:.1f} |", *rows], ok


def passes(way, config: dict, options: dict) -> bool:
    """Whether a way of sharing's own checks (Method.check) accept this pair's checkpoint (its `config`) and
    `options`."""
    try:
        way.check(Request((way.name,), config, str(ROOT / CHECKPOINT), 448, options))
    except MotVizError:
        return False
    return True


def squad_evaluation(device: str, out: Path, scale: Scale) -> list[str]:
    """Section 4: the evaluator's own command on the device, every condition."""
    # every condition this pair and its shipped maps allow (kvcomm shares K/V as they are: only a pair of one
    # architecture has it, and this pair is not one); the direct map is shipped beside the checkpoint
    options = {"direct": str(ROOT / DIRECT)}
    config = read_config(ROOT / CHECKPOINT)
    conditions = registry.names(lambda m: passes(m, config, options), registry.choices("evaluate"))
    direct = registry.option_args(options, conditions, registry.choices("evaluate")).split()
    n = scale.examples
    t0 = time.perf_counter()
    said = io.StringIO()
    with redirect_stderr(Tee(said, sys.stderr)):
        status = evaluate.main(["--checkpoint", str(ROOT / CHECKPOINT), "--datasets", "squad", "--n", str(n),
                                "--conditions", *conditions, *direct, *scale.eval_args, "--out", str(out)])
    seconds = time.perf_counter() - t0
    if status != 0:
        last = [line for line in said.getvalue().splitlines() if line.startswith("error: ")]
        return [f"The evaluator exited with status {status} after {seconds:.0f} s: {' '.join(last[-1:])}"]
    summary = (out / "summary.md").read_text()
    return [f"{n} SQuAD example{'s' * (n != 1)} (seed 0), conditions {', '.join(conditions)}: {seconds:.0f} s.", "",
            summary]


def engine_benchmark(device: str, out: Path, scale: Scale) -> list[str]:
    """Section 5: benchmarks/engine.py on the device (a separate process: it reads $MOT_VIZ_DEVICE)."""
    lengths = [str(n) for n in scale.lengths]
    env = {**os.environ, DEVICE_VARIABLE: device, "CUDA_LAUNCH_BLOCKING": "1", "PYTHONPATH": str(ROOT)}
    table = out / "engine.md"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine.py"), "--lengths", *lengths,
                          "--repeats", str(scale.repeats), "--label", f"on {device}", "--out", str(table)],
                         env=env, capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0:
        return [f"benchmarks/engine.py exited with status {run.returncode}:", "", "```", run.stderr[-2000:], "```"]
    # its headings go two levels down, under this section's
    return ["##" + line if line.startswith("#") else line for line in table.read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="the device checked against the CPU (cuda, cuda:N, cpu)")
    parser.add_argument("--quick", action="store_true",
                        help="the test suite's small mode: 2 contexts of 64 tokens, 2 training steps on a small "
                             "bank, 1 example, the engine at 64 tokens")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "gpu.md"),
                        help="the markdown file whose part is written (every byte outside it is kept)")
    parser.add_argument("--synthetic", action="store_true",
                        help="the part that needs no model file, checkpoint or dataset: synthetic models of real "
                             "architectures (scripts/gpu_check_synthetic.py; handled before this parser)")
    parser.add_argument("--overwrite", action="store_true", help="replace an --out file that is not UTF-8 text")
    args = parser.parse_args(argv)
    # a folder, a read-only place, a file that is no text report: refused before minutes of work
    check_out_place(Path(args.out), folder=False, ours=text_file, overwrite=args.overwrite)
    device = str(model_device(args.device))  # an unavailable device is refused before anything runs
    torch.manual_seed(0)
    t0 = time.perf_counter()
    scale = QUICK if args.quick else FULL
    examples = load_dataset("squad", n=scale.contexts, seed=0)
    seconds = {}

    def timed(section: int, fn, *a):
        start = time.perf_counter()
        out = fn(*a)
        seconds[section] = time.perf_counter() - start
        print(f"[gpu_check] {SECTIONS[section]}: {seconds[section]:.0f} s", file=sys.stderr)
        return out

    rows32, rows16, same_ok = timed(0, compare_with_cpu, device, examples, scale)
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as work:
        work = Path(work)
        train_rows, train_ok = timed(2, train_and_resume, device, work / "train", scale)
        os.environ[DEVICE_VARIABLE] = device  # the evaluator loads its models where $MOT_VIZ_DEVICE says
        evaluation = timed(3, squad_evaluation, device, work / "eval", scale)
        engine = timed(4, engine_benchmark, device, work, scale)
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else platform.processor()
    command = "python scripts/gpu_check.py" + ("" if args.device == "cuda" else f" --device {args.device}") + (
        " --quick" if args.quick else "")
    lines = [
        "# The GPU check", "",
        f"`{command}` on {device} ({name or platform.machine()}), torch {torch.__version__}, "
        f"{datetime.date.today()}: {time.perf_counter() - t0:.0f} s in all (sections 1-2 {seconds[0]:.0f} s, "
        f"3 {seconds[2]:.0f} s, 4 {seconds[3]:.0f} s, 5 {seconds[4]:.0f} s). What each section checks: the docstring "
        "of scripts/gpu_check.py.", "",
        f"## {SECTIONS[0]}", "",
        f"Scale error = max |{device} - cpu| / max |cpu| per compared tensor; tolerance {RTOL:.0e}.", "",
        "| example | quantity | scale error | tolerance | result |", "|---|---|---:|---:|---|", *rows32, "",
        f"## {SECTIONS[1]}", "",
        "Under bfloat16 autocast on the device; scale error against the CPU's float32 (reported, not checked).", "",
        "| example | quantity | scale error |", "|---|---|---:|", *rows16, "",
        f"## {SECTIONS[2]}", "", f"{RECIPE} on {device}.", "", "| | |", "|---|---|", *train_rows, "",
        f"## {SECTIONS[3]}", "", *evaluation, "",
        f"## {SECTIONS[4]}", "", *engine, "",
    ]
    replace = args.overwrite and not text_file(Path(args.out))
    write_part(Path(args.out), lines[0], lines[1:], replace)  # every byte outside its own part is kept
    print(f"{'all checks pass' if same_ok and train_ok else 'a check FAILED'}: {args.out}", file=sys.stderr)
    return 0 if same_ok and train_ok else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))  # a missing GPU or data: one line, `error: <Type>: <message>`
