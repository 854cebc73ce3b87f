"""The GPU check's synthetic part (`scripts/gpu_check.py --synthetic`): no model file, checkpoint or dataset.

    python scripts/gpu_check.py --synthetic                                     # on cuda; its part of benchmarks/gpu.md
    python scripts/gpu_check.py --synthetic --device cpu --quick --out /tmp/gpu.md    # the test suite's mode

Every model is synthetic (mot_viz.engine.synthetic: a shipped architecture with seeded random weights, no tokenizer;
contexts are drawn from a seeded id stream the pair shares, so their alignment is the identity) and every translator
is a recipe's shape (configs/smollm2-to-gemma3.json) with seeded random weights (testing.synthetic_mot). Nothing here
measures quality: it checks that the device computes what the CPU computes, and times the engine at real sizes.

1. **Same results as the CPU, float32.** The synthetic bundled pair (SmolLM2-135M -> Gemma-3-270m architectures) is
   built on the CPU, run there, then moved to the device and run again on the same contexts: translate (the translated
   window's K and V), replay (the replayed cache, every layer), answers (the log-probabilities of the first token after
   the native and the translated caches and a 16-token question) and the logit lens (each layer's KL to native's final
   distribution and the answer token's probability). Each must equal the CPU's within RTOL of the CPU value's scale
   (max |device - cpu| / max |cpu|, the rule of tests/tolerance.py).
2. **bfloat16.** The same under bfloat16 autocast on the device, against the CPU's float32 (reported, not checked).
3. **Training.** 50 replay steps of the recipe's translator (random init, no bank stage) on a synthetic bank of the
   shared id stream, once uninterrupted and once stopped halfway and resumed: equal bit for bit on the CPU, within
   RTOL on a GPU.
4. **Engine benchmark.** benchmarks/engine.py on the synthetic bundled pair and the real-size pairs (Llama-3.2-1B ->
   Qwen2.5-1.5B, Llama-3.1-8B -> Qwen2.5-7B) at 1k-32k target tokens: translator, sparse and dense replay, the
   windowed (engine's) and stock native prefill, the full-depth map without replay, peak device memory, and where the
   replay's time goes (attention kernels against the rest). A pair that does not fit the device is skipped with the
   size it needs; a length a model cannot hold is skipped with its reason.

Sized to stay under 8 minutes on one GPU (not yet timed on one); --quick (2 contexts of 64 tokens, 2 training steps,
the bundled pair at 64 tokens) about 2 minutes on 2 CPU cores. Exit status 0 when every check of sections 1 and 3
passes. Its imports are the engine's and training's only: the code-only bundle (scripts/bundle.py) ships exactly the
wheels they need beyond PyTorch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mot_viz.analysis.logit_lens import logit_lens, translation_lens_trace  # noqa: E402
from mot_viz.cli import run_cli  # noqa: E402
from mot_viz.engine.checkpoint import load_checkpoint  # noqa: E402
from mot_viz.engine.models import DEVICE_VARIABLE, load_model, model_device  # noqa: E402
from mot_viz.engine.mot import translate  # noqa: E402
from mot_viz.engine.synthetic import (NO_QUALITY, SYNTHETIC_ALIGNMENT, shared_vocab, synthetic_ids,  # noqa: E402
                                      synthetic_text)
from mot_viz.engine.testing import synthetic_mot  # noqa: E402
from mot_viz.eval.answers import first_answer_logprobs  # noqa: E402
from mot_viz.fsutil import check_out_place, text_file, write_text_atomic  # noqa: E402
from mot_viz.train.config import parse_args  # noqa: E402
from mot_viz.train.train import train  # noqa: E402

RTOL = 1e-3  # device vs CPU, float32: max |device - cpu| over max |cpu| of each compared tensor
RECIPE = "configs/smollm2-to-gemma3.json"
BUNDLED = ("synthetic:smollm2-135m", "synthetic:gemma3-270m")
REAL_SIZE = (("synthetic:llama3.2-1b", "synthetic:qwen2.5-1.5b"), ("synthetic:llama3.1-8b", "synthetic:qwen2.5-7b"))
QUESTION_TOKENS = 16
TITLE = "# The GPU check: synthetic models"
SECTIONS = ("Same results as the CPU (float32)", "bfloat16 against the CPU's float32", "Training and resume",
            "Engine benchmark")


@dataclass(frozen=True)
class Scale:
    """How much each section does: the full check, or --quick (the test suite's CPU mode)."""

    contexts: int  # synthetic contexts compared with the CPU
    context_tokens: int  # target tokens per context
    lens_tokens: int  # answer positions the logit lens follows
    steps: int  # replay steps trained (stopped at half, resumed)
    bank_rows: int  # rows of the synthetic training bank
    pairs: tuple[tuple[tuple[str, str], tuple[int, ...]], ...]  # engine benchmark: (pair, lengths)
    repeats: int  # engine benchmark repeats


FULL = Scale(3, 448, 8, 50, 64, ((BUNDLED, (1024, 4096, 8000)), (REAL_SIZE[0], (1024, 4096, 16384, 32768)),
                                  (REAL_SIZE[1], (1024, 4096, 16384, 32768))), 1)
QUICK = Scale(2, 64, 1, 2, 4, ((BUNDLED, (64,)),), 1)


def scale_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|, in float64 on the CPU (0 when both are zero)."""
    a, b = actual.detach().to("cpu", torch.float64), expected.detach().to("cpu", torch.float64)
    if a.shape != b.shape:
        return float("inf")
    scale, diff = float(b.abs().max()), float((a - b).abs().max())
    return 0.0 if diff == 0.0 else (diff / scale if scale else float("inf"))


def recipe():
    """The shipped recipe, the shape of every synthetic translator."""
    return parse_args(["--config", str(ROOT / RECIPE)])[0]


def context_results(mot, source, target, index: int, scale: Scale) -> dict[str, torch.Tensor]:
    """What section 1 compares for one synthetic context: translate, replay, answers, logit lens (on the CPU)."""
    vocab = shared_vocab(source.spec.vocab_size, target.spec.vocab_size)
    question = synthetic_text(QUESTION_TOKENS, vocab, seed=1000 + index)
    tr = translate(mot, source, target, synthetic_text(scale.context_tokens, vocab, seed=index))
    first = first_answer_logprobs(target, [tr.native_kv, tr.mixed_kv], question)
    lens = logit_lens(target, translation_lens_trace(mot, source, target, tr, question,
                                                     answer_tokens=scale.lens_tokens)).layers
    flat = lambda kv: torch.cat([t.float().flatten().cpu() for layer in kv for t in layer])  # noqa: E731
    return {
        "translate": torch.cat([tr.translated.keys.float().flatten(), tr.translated.values.float().flatten()]).cpu(),
        "replay": flat(tr.mixed_kv),
        "answers": first.cpu(),
        "logit lens": torch.tensor(lens[["kl_to_native_final", "token_prob"]].to_numpy(dtype="float64")),
    }


def compare_with_cpu(device: str, scale: Scale) -> tuple[list[str], list[str], bool]:
    """Sections 1 and 2: the pair built on the CPU, run there, then moved to the device and run in float32 and under
    bfloat16 autocast; the table rows of each, and whether every float32 comparison passes."""
    source, target = (load_model(name, device="cpu") for name in BUNDLED)
    mot = synthetic_mot(source, target, recipe())
    results = {}
    with torch.no_grad():
        results["cpu"] = [context_results(mot, source, target, i, scale) for i in range(scale.contexts)]
        if device == "cpu":
            results["float32"] = results["cpu"]  # one computation: its rows show the path ran, exactly equal
        else:
            for module in (source.model, target.model, mot):
                module.to(device)
            results["float32"] = [context_results(mot, source, target, i, scale) for i in range(scale.contexts)]
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            results["bfloat16"] = [context_results(mot, source, target, i, scale) for i in range(scale.contexts)]
    rows32, rows16, ok = [], [], True
    for i in range(scale.contexts):
        for quantity, cpu in results["cpu"][i].items():
            err32 = scale_error(results["float32"][i][quantity], cpu)
            ok &= err32 <= RTOL
            rows32.append(f"| {i} | {quantity} | {err32:.2e} | {RTOL:.0e} | {'pass' if err32 <= RTOL else 'FAIL'} |")
            rows16.append(f"| {i} | {quantity} | {scale_error(results['bfloat16'][i][quantity], cpu):.2e} |")
    return rows32, rows16, ok


def train_and_resume(device: str, out: Path, scale: Scale) -> tuple[list[str], bool]:
    """Section 3: the recipe's translator (random init, no bank stage) trained on a synthetic bank on the device,
    uninterrupted, and stopped halfway then resumed."""
    source, target = (load_model(name, device=device) for name in BUNDLED)
    vocab = shared_vocab(source.spec.vocab_size, target.spec.vocab_size)
    cfg = replace(recipe(), init="random", bank_steps=0, linear_from="", max_steps=scale.steps, save_every=5,
                  log_every=5, total_tokens=128, prefix_tokens=64, batch_size=1, device=device)
    if scale is QUICK:
        cfg = replace(cfg, save_every=1, log_every=1, total_tokens=64, prefix_tokens=32)
    bank = torch.tensor([synthetic_ids(cfg.total_tokens, vocab, seed=10_000 + i) for i in range(scale.bank_rows)])
    seconds, rows, ok = stopped_and_resumed(cfg, out, device, source=source, target=target, bank=bank)
    return [f"| replay steps on a synthetic bank of {scale.bank_rows} rows of {cfg.total_tokens} ids | {scale.steps} |",
            f"| seconds, uninterrupted run | {seconds:.1f} |", *rows], ok


def stopped_and_resumed(cfg, out: Path, device: str, **inputs) -> tuple[float, list[str], bool]:
    """Train cfg (its max_steps) uninterrupted, and again stopped halfway then resumed, with train's other `inputs`
    (the models, a bank); the seconds of the uninterrupted run, its loss and the two translators' equality as table
    rows, and whether they are equal (bit for bit on the CPU, within RTOL of scale on a device)."""
    steps = cfg.max_steps
    t0 = time.perf_counter()
    whole = train(replace(cfg, output_dir=str(out / "whole")), progress=False, **inputs)
    seconds = time.perf_counter() - t0
    half = replace(cfg, output_dir=str(out / "resumed"), max_steps=steps // 2)
    train(half, progress=False, **inputs)
    resumed = train(replace(half, max_steps=steps), resume=True, progress=False, **inputs)
    a = load_checkpoint(whole / "checkpoint")[0].translator.state_dict()
    b = load_checkpoint(resumed / "checkpoint")[0].translator.state_dict()
    exact = all(torch.equal(a[k], b[k]) for k in a)
    err = max(scale_error(b[k], a[k]) for k in a)
    ok = exact if device == "cpu" else err <= RTOL
    log = [json.loads(line) for line in (whole / "log.jsonl").read_text().splitlines()]
    return seconds, [f"| loss at the first and last logged step | {log[0]['loss']:.4f} -> {log[-1]['loss']:.4f} |",
                     f"| stopped at step {steps // 2}, resumed to {steps}: equal to the uninterrupted run | "
                     f"{'bit for bit' if exact else f'to {err:.2e} of scale'} ({'pass' if ok else 'FAIL'}) |"], ok


def engine_benchmark(device: str, out: Path, scale: Scale) -> list[str]:
    """Section 4: benchmarks/engine.py on each pair on the device (one process per pair: it reads $MOT_VIZ_DEVICE)."""
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])  # the bundle's wheels stay on it
    env = {**os.environ, DEVICE_VARIABLE: device, "CUDA_LAUNCH_BLOCKING": "1", "PYTHONPATH": path}
    lines = []
    for i, ((source, target), lengths) in enumerate(scale.pairs):
        table = out / f"engine-{i}.md"
        t0 = time.perf_counter()
        python = [sys.executable, *(["-S"] if sys.flags.no_site else [])]  # as isolated as this process
        run = subprocess.run([*python, str(ROOT / "benchmarks" / "engine.py"), "--source", source, "--target",
                              target, "--recipe", RECIPE, "--lengths", *map(str, lengths), "--repeats",
                              str(scale.repeats), "--split", "--dense", "--direct", "synthetic", "--label",
                              f"on {device}", "--out", str(table)], env=env, capture_output=True, text=True, cwd=ROOT)
        seconds = time.perf_counter() - t0
        lines += [f"### {source} → {target} ({seconds:.0f} s)", ""]
        if run.returncode != 0:
            said = [line for line in run.stderr.splitlines() if line.strip()]
            lines += [f"Not measured: benchmarks/engine.py exited with status {run.returncode}: "
                      f"{said[-1] if said else 'no message'}", ""]
            continue
        body = table.read_text().splitlines()[1:]  # its title is this subsection's heading
        lines += ["##" + line if line.startswith("#") else line for line in body] + [""]  # under this subsection
    return lines


def machine(device: str) -> str:
    """The device's name and the versions that matter."""
    import transformers

    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores")
    cuda = f", CUDA {torch.version.cuda}" if torch.version.cuda else ""
    return (f"{device} ({name}); Python {platform.python_version()}, torch {torch.__version__}{cuda}, "
            f"transformers {transformers.__version__}")


def write_part(path: Path, title: str, lines: list[str], replace: bool = False) -> None:
    """Put a part (a top-level `# ` heading and the lines up to the next one) into the markdown file at `path`,
    replacing the part of the same title, or adding it at the end; every byte outside that part stays as it was (the
    synthetic and the real-weights check each own one part of gpu.md, and a user's notes around them are kept).
    replace: write the part alone (--overwrite of a file that is not UTF-8 text)."""
    text = "" if replace or not path.is_file() else path.read_bytes().decode("utf-8")  # its line ends as they are
    part = "\n".join([title, *lines]).strip() + "\n"
    rows = text.splitlines(keepends=True)
    start = next((i for i, row in enumerate(rows) if row.rstrip("\r\n") == title), None)
    if start is None:
        before, after = text + ("\n" if text and not text.endswith("\n") else "") + ("\n" if text else ""), ""
    else:
        end = next((i for i in range(start + 1, len(rows)) if rows[i].startswith("# ")), len(rows))
        before, after = "".join(rows[:start]), "".join(rows[end:])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, before + part + ("\n" if after else "") + after)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", action="store_true", help="this part (scripts/gpu_check.py dispatches on it)")
    parser.add_argument("--device", default="cuda", help="the device checked against the CPU (cuda, cuda:N, cpu)")
    parser.add_argument("--quick", action="store_true",
                        help="the test suite's small mode: 2 contexts of 64 tokens, 2 training steps, the synthetic "
                             "bundled pair at 64 tokens")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "gpu.md"),
                        help="the markdown file whose synthetic part is written (every byte of its other parts, "
                             "and of anything before its first heading, is kept)")
    parser.add_argument("--overwrite", action="store_true", help="replace an --out file that is not UTF-8 text")
    args = parser.parse_args(argv)
    # a folder, a read-only place, a file that is no text report: refused before minutes of work
    check_out_place(Path(args.out), folder=False, ours=text_file, overwrite=args.overwrite)
    device = str(model_device(args.device))  # an unavailable device is refused before anything runs
    torch.manual_seed(0)
    scale = QUICK if args.quick else FULL
    t0, seconds = time.perf_counter(), {}

    def timed(section: int, fn, *a):
        start = time.perf_counter()
        out = fn(*a)
        seconds[section] = time.perf_counter() - start
        print(f"[gpu_check --synthetic] {SECTIONS[section]}: {seconds[section]:.0f} s", file=sys.stderr)
        return out

    rows32, rows16, same_ok = timed(0, compare_with_cpu, device, scale)
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as work:
        work = Path(work)
        train_rows, train_ok = timed(2, train_and_resume, device, work / "train", scale)
        engine = timed(3, engine_benchmark, device, work, scale)
    command = "python scripts/gpu_check.py --synthetic" + ("" if args.device == "cuda" else f" --device {args.device}") \
        + (" --quick" if args.quick else "")
    lines = [
        "",
        f"`{command}` on {machine(device)}, {datetime.date.today()}: {time.perf_counter() - t0:.0f} s in all "
        f"(sections 1-2 {seconds[0]:.0f} s, 3 {seconds[2]:.0f} s, 4 {seconds[3]:.0f} s). What each section checks: "
        "the docstring of scripts/gpu_check_synthetic.py.", "",
        f"**{NO_QUALITY.capitalize()}.** Every model has seeded random weights of its architecture "
        f"(configs/architectures) and every translator the recipe's shape ({RECIPE}) with seeded random weights; "
        f"{SYNTHETIC_ALIGNMENT}.", "",
        f"## {SECTIONS[0]}", "",
        f"The synthetic bundled pair, {scale.contexts} contexts of {scale.context_tokens} ids of the shared stream "
        f"(seeds 0-{scale.contexts - 1}). Scale error = max |{device} - cpu| / max |cpu| per compared tensor; "
        f"tolerance {RTOL:.0e}.", "",
        "| context | quantity | scale error | tolerance | result |", "|---|---|---:|---:|---|", *rows32, "",
        f"## {SECTIONS[1]}", "",
        "Under bfloat16 autocast on the device; scale error against the CPU's float32 (reported, not checked).", "",
        "| context | quantity | scale error |", "|---|---|---:|", *rows16, "",
        f"## {SECTIONS[2]}", "", f"{RECIPE}'s translator (random init, no bank stage) on {device}.", "",
        "| | |", "|---|---|", *train_rows, "",
        f"## {SECTIONS[3]}", "", *engine,
    ]
    write_part(Path(args.out), TITLE, lines, replace=args.overwrite and not text_file(Path(args.out)))
    print(f"{'all checks pass' if same_ok and train_ok else 'a check FAILED'}: {args.out}", file=sys.stderr)
    return 0 if same_ok and train_ok else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
