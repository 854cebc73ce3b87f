"""Window fidelity of a translator on held-out text, beside its baselines (method.md §13).

    python -m mot_viz.eval.fidelity --checkpoint pretrained/smollm2-to-gemma3 --corpus squad --n 40 --record

For every context and window layer: raw and centered cosine of K and V to the native window, relative
error, and the cosine between the window layer's attention output with the translated K/V and with the
native K/V on the same queries: the native prefill's by default, the replay's own with `--queries replay`
(method.md §13 names the replay's; docs/decisions.md says why the default differs and what it changes).
The *mean vector* baseline (every token's K/V replaced by the
mean native K/V of that layer over reference prose) is scored the same way, so every number has its floor
beside it. All comparisons are in the cache's (post-RoPE) space, whatever the translator's key space.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cli import run_cli
from ..engine.checkpoint import load_checkpoint, read_config, record_metrics
from ..engine.models import load_model
from ..fsutil import check_out_place
from ..train.bank import CORPORA
from ..train.mean_vector import REFERENCE_PASSAGES, heldout_texts, reference_means
from ..train.window_fidelity import METRICS, QUERY_SOURCES, fidelity_record, fidelity_table, summarize_fidelity


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", nargs="+", required=True, help="checkpoint folders of one model pair")
    parser.add_argument("--corpus", nargs="+", default=["squad", "lambada-heldout"], choices=sorted(CORPORA),
                        help="held-out text to measure on")
    parser.add_argument("--n", type=int, default=40, help="contexts per corpus")
    parser.add_argument("--reference_n", type=int, default=REFERENCE_PASSAGES,
                        help="LAMBADA training passages for the mean vectors")
    parser.add_argument("--record", action="store_true", help="write the summary into each config.json (metrics.fidelity)")
    parser.add_argument("--out", help="folder for the per-context CSVs (one per checkpoint and corpus)")
    parser.add_argument("--overwrite", action="store_true", help="write into an --out folder holding other files")
    parser.add_argument("--queries", choices=QUERY_SOURCES, default="native",
                        help="the attention-output cosine's queries: the native prefill's (default) or the replay's "
                             "own (method.md §13)")
    args = parser.parse_args(argv)
    if args.record and args.queries != "native":
        parser.error("--record stores the default measure (native queries); run --queries replay without --record")

    def body() -> None:
        if args.out:  # before any model loads: a folder holding other files, a read-only place, a file
            written = {f"{Path(path).name}-{corpus}.csv" for path in args.checkpoint for corpus in args.corpus}
            check_out_place(Path(args.out), ours=lambda path: path.name in written, overwrite=args.overwrite)
        configs = [read_config(c) for c in args.checkpoint]
        source, target = load_model(configs[0]["source"]["name"]), load_model(configs[0]["target"]["name"])
        for path in args.checkpoint:
            mot, _ = load_checkpoint(path, source, target)
            means = reference_means(target, mot.channels.target_layers, args.reference_n)
            recorded = {}
            for corpus in args.corpus:
                table = fidelity_table(mot, source, target, heldout_texts(target, corpus, args.n), means,
                                       queries=args.queries)
                recorded[corpus] = fidelity_record(table, corpus, means)
                summary = summarize_fidelity(table)
                window = summary[summary.layer == "window"].set_index("candidate")
                print(f"{Path(path).name} on {corpus} (n={len(table.context.unique())}):")
                print(window[list(METRICS)].round(3).to_string())
                if args.out:
                    out = Path(args.out)
                    out.mkdir(parents=True, exist_ok=True)
                    table.to_csv(out / f"{Path(path).name}-{corpus}.csv", index=False)
            command = "python -m mot_viz.eval.fidelity " + " ".join(sys.argv[1:] if argv is None else argv)
            if args.record:
                record_metrics(path, "fidelity", {"command": command, **recorded})

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
