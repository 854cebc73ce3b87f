"""Selective layer sharing between two models of one architecture (KVComm, method.md §15): the condition ``kvcomm``.

The sender (the source model) prefills the context; its K/V go straight into the receiver's (the target's) cache at
the selected layers, with no translation and no replay. Every other layer keeps only token 0, the attention sink.
Only a pair whose caches have the same shape per layer and whose tokenizers share one vocabulary can do this (the
sender reads the receiver's own token ids, so its K/V sit at the positions the receiver's question expects); any
other pair is refused before any work (check_kvcomm_pair).

Layer choice, as method.md §15 reads KVComm's ``layer_importance.py``: each layer's score is the attention mass
that the receiver's question positions put on the sender's context positions (token 0, the sink, excluded), with the
sender's K/V at every layer, averaged over heads, question positions and a calibration set; the scores are normalised to
[0, 1] (min–max) and mixed as ``alpha · score + (1 − alpha) · prior``, the prior a Gaussian over depth
(μ = 0.5 (L − 1), σ = 10, peak 1); the top ``fraction`` of the layers (rounded, at least one) is kept.
The attention mass is the "context" share of mot_viz.analysis.logit_lens.attention_shares, computed the same way
(the layers' recorded queries, hf.causal_probs over the cache), here averaged over heads and positions.

Where this departs from KVComm:

* ``alpha`` is 0.5 (score and prior weighed equally); KVComm's code defaults to 1.0 (the score alone, the prior
  weighing nothing). The shipped runs used 0.5 (docs/decisions.md records why it stays).
* The depth prior is not min–max normalised: it runs from exp(−0.5 (μ/σ)²) at the ends (0.35 for 30 layers) to 1,
  so at alpha < 1 it separates layers less than a [0, 1] prior would. At KVComm's alpha = 1.0 it does not count.
* Calibration: the evaluator calibrates once per run on the first example of its first dataset (a set of size 1,
  KVComm's default size), and that example is also evaluated, one of the run's examples.
* The receiver's instruction is inside the shared context: the sender prefills the receiver's whole context prompt
  (instruction, then passage), so at an unshared layer the instruction is hidden with the passage. KVComm's receiver
  reads its own instruction beside the question.
* Token 0 at an unselected layer is not cut from the cache: every layer of the cache holds all P + N positions
  (Hugging Face's cache, its masks and the positions of the question all assume one length for every layer), and
  an attention mask per layer hides positions 1 … P + N − 1 there (hf.AttentionPlan.hide). What the receiver computes
  is what it would compute from a cache holding token 0 alone at those layers, at the positions the question has
  after the whole context. Such a cache is therefore answered on its own (not in the answers' batch), under its plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..engine import hf
from ..engine.alignment import encode
from ..engine.models import LoadedModel, ModelSpec
from ..engine.mot import MoT, native_cache, target_context_ids
from ..engine.prompts import QAExample, build_prompt
from ..errors import ConfigError
from .method import Built, Inputs, Loading, Method, Offering, Option, Request, layers_bytes

KVCOMM_FRACTION = 0.3  # share of the layers whose K/V are shared (KVComm's README; --kvcomm_fraction)
KVCOMM_ALPHA = 0.5  # weight of the attention score against the depth prior (method.md §15 records no default)
PRIOR_SIGMA = 10.0  # σ of the Gaussian prior over depth, in layers (KVComm's)
FRACTION_OPTION = Option("kvcomm_fraction", float, KVCOMM_FRACTION, "share of the layers the 'kvcomm' way of sharing "
                         "reads the source's K/V at (in (0, 1]; the others keep token 0 only)")


def check_kvcomm_fraction(fraction: float) -> None:
    """Raise ConfigError unless 0 < fraction ≤ 1."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"--kvcomm_fraction must be in (0, 1], got {fraction}. Pass e.g. --kvcomm_fraction 0.3.")


def check_kvcomm_pair(source: ModelSpec | dict, target: ModelSpec | dict) -> None:
    """Raise ConfigError unless the two models' caches have one shape per layer and their tokenizers one vocabulary
    (specs, or their JSON as a checkpoint's config.json holds them)."""
    s = source.to_json() if isinstance(source, ModelSpec) else source
    t = target.to_json() if isinstance(target, ModelSpec) else target
    shape = lambda m: (m["num_layers"], m["num_kv_heads"], m["head_dim"])  # noqa: E731
    if shape(s) != shape(t):
        raise ConfigError(
            f"The kvcomm condition shares K/V as they are, so it needs caches of one shape per layer: the source "
            f"'{s['name']}' has {s['num_layers']} layers × {s['num_kv_heads']} KV heads × {s['head_dim']}, the target "
            f"'{t['name']}' {t['num_layers']} × {t['num_kv_heads']} × {t['head_dim']}. Use it with a pair of one "
            "architecture (e.g. pretrained/smollm2-to-smollm2), or leave kvcomm out of --conditions.")
    if s.get("fingerprint") != t.get("fingerprint"):
        raise ConfigError(
            f"The kvcomm condition needs the source '{s['name']}' and the target '{t['name']}' to share one tokenizer "
            "(the source's K/V must sit at the target's positions); their vocabularies or geometries differ. Use "
            "it with a pair of one architecture (e.g. pretrained/smollm2-to-smollm2), or leave kvcomm out of "
            "--conditions.")


def depth_prior(num_layers: int, sigma: float = PRIOR_SIGMA) -> torch.Tensor:
    """KVComm's Gaussian prior over depth [L]: peak 1 at the middle layer, μ = 0.5 (L − 1)."""
    depth = torch.arange(num_layers, dtype=torch.float64)
    return torch.exp(-0.5 * ((depth - 0.5 * (num_layers - 1)) / sigma) ** 2)


def select_layers(scores: torch.Tensor, fraction: float = KVCOMM_FRACTION, alpha: float = KVCOMM_ALPHA,
                  sigma: float = PRIOR_SIGMA) -> tuple[int, ...]:
    """The layers to share, ascending: the top round(fraction · L) (at least 1) of alpha · normalised score +
    (1 − alpha) · depth prior. scores [L]: each layer's attention mass on the context (any scale); ties go to the
    shallower layer."""
    check_kvcomm_fraction(fraction)
    s = scores.double()
    span = s.max() - s.min()
    s = (s - s.min()) / span if span > 0 else torch.zeros_like(s)
    mixed = alpha * s + (1 - alpha) * depth_prior(len(s), sigma)
    keep = max(1, round(fraction * len(s)))
    order = sorted(range(len(s)), key=lambda layer: (-float(mixed[layer]), layer))
    return tuple(sorted(order[:keep]))


@dataclass(frozen=True)
class KVCommSelection:
    """Which layers the receiver takes from the sender, and why (written beside an evaluation's results)."""

    layers: tuple[int, ...]  # shared layers, ascending
    scores: tuple[float, ...]  # per layer: the question's mean attention mass on the sender's context (sink excluded)
    fraction: float
    alpha: float
    calibration: tuple[str, ...]  # ids of the calibration examples


@dataclass(frozen=True)
class KVCommCache:
    """The receiver's cache of one context and the plan to answer under (it hides the context at unshared layers)."""

    kv: list[hf.KV]  # every layer [1, n_kv, P + N, d_h]: the sender's K/V of the prefix and the context
    plan: hf.AttentionPlan  # hide: unshared layer -> positions (1, P + N) unseen, so they read token 0 alone
    seconds: float  # the sender's prefill


def sender_cache(source: LoadedModel, target: LoadedModel, target_ids: torch.Tensor) -> list[hf.KV]:
    """The sender's K/V [1, n_kv, P + N, d_h] per layer of the receiver's own context ids [1, N], after its prefix."""
    if source.prefix_ids != target.prefix_ids:
        raise ConfigError(f"The source '{source.spec.name}' and the target '{target.spec.name}' start their caches "
                          "with different prefixes; the kvcomm condition needs one tokenizer for both.")
    return native_cache(source, target_ids)


def context_attention(target: LoadedModel, kv: list[hf.KV], suffix_ids: list[int], prefix_len: int) -> torch.Tensor:
    """Per layer [L] (float64): the attention mass of the question's positions on the context positions of `kv`
    (from max(prefix_len, 1): the sink, token 0, excluded), averaged over heads and question positions."""
    layers = range(len(kv))
    plan = hf.AttentionPlan(record_queries=set(layers))
    out = hf.run(target.model, target.ids_tensor(suffix_ids), kv=kv, plan=plan, logits_to_keep=1)
    first, end = max(prefix_len, 1), kv[0][0].shape[2]
    masses = []
    for layer in layers:
        query, scaling, window = out.queries[layer]
        probs = hf.causal_probs(query, out.kv[layer][0], scaling, window)  # (1, H, S, P + N + S)
        masses.append(float(probs[..., first:end].sum(-1).mean()))
    return torch.tensor(masses, dtype=torch.float64)


@torch.no_grad()
def kvcomm_selection(source: LoadedModel, target: LoadedModel, calibration: list[QAExample],
                     fraction: float = KVCOMM_FRACTION, alpha: float = KVCOMM_ALPHA) -> KVCommSelection:
    """Score every layer on the calibration examples (the sender's K/V at every layer) and choose the shared ones."""
    check_kvcomm_pair(source.spec, target.spec)
    check_kvcomm_fraction(fraction)
    if not calibration:
        raise ConfigError("the kvcomm layer choice needs at least one calibration example")
    total = torch.zeros(target.spec.num_layers, dtype=torch.float64)
    for example in calibration:
        prompt = build_prompt(example, target.chat_frame)
        kv = sender_cache(source, target, target_context_ids(target, prompt.context_text))
        total += context_attention(target, kv, encode(target.tokenizer, prompt.suffix_text), len(target.prefix_ids))
    scores = total / len(calibration)
    return KVCommSelection(select_layers(scores, fraction, alpha), tuple(float(s) for s in scores), fraction, alpha,
                           tuple(e.id for e in calibration))


@torch.no_grad()
def kvcomm_cache(source: LoadedModel, target: LoadedModel, target_ids: torch.Tensor,
                 selection: KVCommSelection) -> KVCommCache:
    """The receiver's cache of the context ids [1, N]: the sender's K/V, read in full at the selected layers and only
    at token 0 elsewhere."""
    check_kvcomm_pair(source.spec, target.spec)
    start = time.perf_counter()
    kv = sender_cache(source, target, target_ids)
    seconds = time.perf_counter() - start
    length = kv[0][0].shape[2]
    hide = {layer: (1, length) for layer in range(len(kv)) if layer not in selection.layers and length > 1}
    return KVCommCache(kv, hf.AttentionPlan(hide=hide), seconds)



class SelectiveLayers(Method):
    def not_offered(self, offering: Offering) -> str | None:
        try:
            check_kvcomm_pair(offering.mot.source, offering.mot.target)
        except ConfigError as exc:  # its message less its command-line advice
            return (str(exc).split(" Use it with")[0] + " It is offered for a pair of one architecture (e.g. "
                    "smollm2-135m → smollm2-135m).")
        return None

    def check(self, request: Request) -> None:
        check_kvcomm_fraction(FRACTION_OPTION.of(request.options))
        if self.name in request.conditions:
            check_kvcomm_pair(request.config["source"], request.config["target"])

    def load(self, loading: Loading) -> KVCommSelection | None:
        """Its layer choice, calibrated on the run's first example (none: nothing to calibrate on)."""
        calibration = loading.calibration  # made once: the run prepares its first example(s) here
        if not calibration:
            return None
        return kvcomm_selection(loading.source, loading.target, list(calibration),
                                FRACTION_OPTION.of(loading.options))

    def record(self, artifact) -> dict:
        return {"kvcomm_layers": tuple(artifact.layers), "kvcomm_scores": tuple(artifact.scores)}

    def build(self, inputs: Inputs) -> Built:
        """The source's own K/V of the target's tokens, read at the chosen layers only; all of it done ahead."""
        shared = kvcomm_cache(inputs.source, inputs.target, inputs.translation.target_ids, inputs.artifact)
        return Built(shared.kv, shared.seconds, shared.seconds, plan=shared.plan, held=inputs.artifact)

    def handed_bytes(self, built: Built | None, tokens: int, target: ModelSpec, window_layers: int,
                     source: ModelSpec | None = None) -> float:
        """The source's own K and V at the shared layers."""
        return float(layers_bytes(tokens, len(built.held.layers), source.kv_hidden))

    def handed_what(self, built: Built | None, target: ModelSpec, window_layers: int) -> str:
        return f"the source's own K/V at {len(built.held.layers)} of {target.num_layers} layers"

    def stages(self, built: Built, timings: dict[str, float]) -> list[tuple[str, float]]:
        return [("source prefill", built.seconds)]  # the source's K/V are its cache: its prefill is all of the build

    def carries(self, mot: MoT, artifact=None) -> tuple[int, ...] | None:
        return artifact.layers

    def target_work(self, built: Built | None, tokens: int, prefix: int = 0) -> tuple[str, int]:
        return "none", 0

    def target_side(self, built: Built | None, timings) -> float:
        return 0.0


KVCOMM = SelectiveLayers("kvcomm", "Selective layer sharing (KVComm: the source's own K/V at the chosen layers, token "
                         "0 elsewhere)", (FRACTION_OPTION,), "its layer choice, calibrated on the run's first example "
                         "(kvcomm_selection)", records=("kvcomm_layers", "kvcomm_scores"), comparable=False,
                         patchable=True, evaluations=("evaluate", "long_context", "conversation"),
                         short="KVComm (the source's K/V at chosen layers)")
