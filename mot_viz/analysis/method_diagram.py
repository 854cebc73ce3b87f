"""The method as a picture: the source's and the target's layer stacks at their real depths, the injection window's
channels (source layer → target layer), the translator's experts and router between them, the replay up the target
and where the context, the question and the answer enter (method.md §3–§6). Drawn from a checkpoint's model specs,
channels, translator and replay config; a plotly figure out, no Streamlit.

Every layer is one marker, so a stack's markers count its layers; every channel is one line trace (its ``meta`` is
the (source, target) pair). ``highlight`` brightens what a page is about and dims the rest.
"""

from __future__ import annotations

import plotly.graph_objects as go

from ..engine.channels import Channels
from ..engine.models import ModelSpec
from ..engine.patching import layer_groups
from ..engine.replay_config import ReplayConfig
from ..engine.translator import TranslatorConfig

# what a page is about -> the parts of the picture it brightens
HIGHLIGHTS = {"window": ("window", "channels"), "experts": ("experts", "router"),
              "above": ("above", "replay"), "global": ("global",)}
HIGHLIGHT_LABELS = {"window": "the injection window", "experts": "the experts and the router",
                    "above": "the layers above the window", "global": "the target's global layers"}
SOURCE_X, TRANSLATOR_X, TARGET_X = 0.0, 1.0, 2.0
COLOURS = {"source": "#9467bd", "window": "#ff7f0e", "below": "#1f77b4", "above": "#2ca02c", "experts": "#d62728",
           "router": "#7f7f7f", "replay": "#2ca02c", "global": "#000000", "channels": "#ff7f0e"}
DIM = 0.2  # opacity of the parts a highlight leaves out


def global_layers(spec: ModelSpec) -> tuple[int, ...]:
    """The layers that attend over the whole context where the model also has sliding-window layers (Gemma 3's
    global layers); () for a model whose layers are all alike."""
    return layer_groups(spec, ()).get("global", ())


def _target_part(layer: int, channels: Channels) -> str:
    return "below" if layer < channels.start else "window" if layer in channels.target_layers else "above"


def _target_hover(layer: int, part: str, replay: ReplayConfig) -> str:
    if replay.direct:
        return f"target layer {layer}: its cache is the translated K/V, used as they are (no replay)"
    dense = replay.topk_sparse_attn is None or (layer < replay.num_bottom_full_attn and part != "window")
    attention = "dense attention" if dense else f"sparse top-{replay.topk_sparse_attn} attention"
    return {"below": f"target layer {layer}: below the window, runs natively ({attention}) and caches its own K/V",
            "window": f"target layer {layer}: window, its attention ({attention}) reads the translated K/V; it caches "
                      "the K/V it computes itself from its hidden state",
            "above": f"target layer {layer}: above the window, runs natively ({attention}) on hidden states the window "
                     "shifted, and caches the K/V it computes"}[part]


def method_diagram(source: ModelSpec, target: ModelSpec, channels: Channels, translator: TranslatorConfig,
                   replay: ReplayConfig, highlight: str | None = None) -> go.Figure:
    """The MoT of one checkpoint as a picture; `highlight` (a key of HIGHLIGHTS, or None for all) brightens what a
    page is about: the window, the experts, the layers above the window, or the target's global layers."""
    if highlight is not None and highlight not in HIGHLIGHTS:
        raise ValueError(f"highlight must be one of {', '.join(HIGHLIGHTS)} or None, not {highlight!r}")
    lit = set(HIGHLIGHTS.get(highlight, ())) if highlight else None

    def opacity(*parts: str) -> float:
        return 1.0 if lit is None or lit & set(parts) else DIM

    depth = max(source.num_layers, target.num_layers)
    size = max(4.0, min(16.0, 0.7 * 400 / (depth + 6)))  # a gap between layers
    fig = go.Figure()
    # the source stack: the window's layers are what the translator reads
    read = set(channels.source_layers)
    for part, layers in (("source", [l for l in range(source.num_layers) if l not in read]),
                         ("window", sorted(read))):
        fig.add_trace(go.Scatter(
            x=[SOURCE_X] * len(layers), y=layers, mode="markers", legendgroup="source",
            name="source: layers sent to the translator" if part == "window" else "source: its other layers",
            marker=dict(symbol="square", size=size, color=COLOURS[part]), opacity=opacity(part, "source"),
            hovertemplate="source layer %{y}" + (": its K/V are translated" if part == "window" else "")
                          + "<extra></extra>"))
    # the target stack, by where each layer stands against the window
    for part, name in (("below", "target: below the window"), ("window", "target: the window"),
                       ("above", "target: above the window")):
        layers = [l for l in range(target.num_layers) if _target_part(l, channels) == part]
        if layers:
            fig.add_trace(go.Scatter(
                x=[TARGET_X] * len(layers), y=layers, mode="markers", legendgroup="target", name=name,
                marker=dict(symbol="square", size=size, color=COLOURS[part]), opacity=opacity(part),
                text=[_target_hover(l, part, replay) for l in layers], hovertemplate="%{text}<extra></extra>"))
    globals_ = global_layers(target)
    if globals_:
        fig.add_trace(go.Scatter(
            x=[TARGET_X] * len(globals_), y=list(globals_), mode="markers", legendgroup="global",
            name="target: global (full-attention) layers", opacity=opacity("global"),
            marker=dict(symbol="square-open", size=size + 8, line=dict(width=3), color=COLOURS["global"]),
            hovertemplate="target layer %{y}: global, attends over the whole context (the others: a sliding "
                          f"window of {target.sliding_window} tokens)<extra></extra>"))
    # the translator between the stacks, at the window's height
    centre = (sum(channels.source_layers) + sum(channels.target_layers)) / (2 * channels.window)
    if translator.variant == "mot":
        experts = translator.num_experts
        ys = [centre + 1.6 * (e - (experts - 1) / 2) for e in range(experts)]
        fig.add_trace(go.Scatter(
            x=[TRANSLATOR_X] * experts, y=ys, mode="markers+text", name=f"{experts} experts",
            legendgroup="translator", marker=dict(symbol="circle", size=22, color=COLOURS["experts"]),
            text=[f"E{e}" for e in range(experts)], textfont=dict(color="white", size=10), opacity=opacity("experts"),
            hovertemplate="expert %{text}: attends across all the context's tokens as it translates the whole "
                          "window<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=[TRANSLATOR_X], y=[min(ys) - 2.2], mode="markers+text", name="router", legendgroup="translator",
            marker=dict(symbol="diamond", size=24, color=COLOURS["router"]), text=["R"], opacity=opacity("router"),
            textfont=dict(color="white", size=10),
            hovertemplate=f"router: per token, keeps the top-{translator.top_k} of {experts} experts and weighs their "
                          "outputs (gates summing to 1)<extra></extra>"))
        fig.add_annotation(x=TRANSLATOR_X, y=max(ys) + 1.2, showarrow=False, yanchor="bottom", font=dict(size=11),
                           text=f"<b>translator</b> (K and V each):<br>{experts} experts, router keeps top-"
                                f"{translator.top_k} per token")
    else:
        label = "linear map" if translator.variant == "linear" else "translator"
        fig.add_trace(go.Scatter(
            x=[TRANSLATOR_X], y=[centre], mode="markers+text", name=label, legendgroup="translator",
            marker=dict(symbol="circle", size=26, color=COLOURS["experts"]), text=[label[0].upper()],
            textfont=dict(color="white"), opacity=opacity("experts"),
            hovertemplate=f"{label}: one per K/V path, no router<extra></extra>"))
    # the channels: source layer -> translator -> target layer
    offsets = [0.5 * (i - (channels.window - 1) / 2) for i in range(channels.window)] if channels.window > 1 else [0.0]
    for (s, t), dy in zip(channels.pairs(), offsets):
        fig.add_trace(go.Scatter(
            x=[SOURCE_X, TRANSLATOR_X - 0.18, None, TRANSLATOR_X + 0.18, TARGET_X],
            y=[s, centre + dy, None, centre + dy, t], mode="lines", meta=[s, t], legendgroup="channels",
            name="channels (source → target layer)", showlegend=(s, t) == channels.pairs()[0],
            line=dict(color=COLOURS["channels"], width=1.5), opacity=opacity("channels", "window"),
            hovertemplate=f"source layer {s} → target layer {t}<extra></extra>"))
    _annotate(fig, source, target, channels, replay, opacity)
    fig.update_xaxes(visible=False, range=[-0.6, 3.0])
    fig.update_yaxes(title_text="layer (0 = bottom)", range=[-3.5, depth + 1.5], zeroline=False, dtick=5)
    fig.update_layout(height=560, margin=dict(t=30, l=50, r=10, b=10), plot_bgcolor="white",
                      legend=dict(orientation="h", yanchor="top", y=-0.02, font=dict(size=11)))
    return fig


def _annotate(fig: go.Figure, source: ModelSpec, target: ModelSpec, channels: Channels, replay: ReplayConfig,
              opacity) -> None:
    """The stacks' names, the context entering both, the replay up the target, the question in and the answer out."""
    notes = [
        dict(x=SOURCE_X, y=source.num_layers + 0.6, text=f"<b>source</b> {source.name}<br>{source.num_layers} "
             "layers: prefills the context", showarrow=False, yanchor="bottom"),
        dict(x=TARGET_X, y=target.num_layers + 0.6, text=f"<b>target</b> {target.name}<br>{target.num_layers} layers",
             showarrow=False, yanchor="bottom"),
        dict(x=TRANSLATOR_X, y=-3.2, showarrow=False, yanchor="bottom",
             text="<b>context text</b>: the source reads it; the target never runs over it" if replay.direct else
             "<b>context text</b>: each model reads its own tokens of it;<br>the source's window K/V are aligned to "
             "the target's tokens"),
    ]
    for x in (SOURCE_X,) if replay.direct else (SOURCE_X, TARGET_X):
        notes.append(dict(x=x, y=-0.7, ax=x, ay=-2.6, axref="x", ayref="y", showarrow=True, arrowhead=2,
                          text="context", yanchor="top"))
    if replay.direct:
        notes.append(dict(x=TARGET_X + 0.45, y=target.num_layers / 2, showarrow=False, textangle=-90,
                          text="no replay: the translated K/V are the target's cache as they are"))
    else:
        fig.add_trace(go.Scatter(
            x=[TARGET_X + 0.22, TARGET_X + 0.22], y=[-0.4, target.num_layers - 0.6], mode="lines+markers",
            name="replay (the target's forward pass over the context)", legendgroup="replay",
            marker=dict(symbol=["line-ew", "arrow-up"], size=[1, 14]), line=dict(color=COLOURS["replay"], width=3),
            opacity=opacity("replay"), hovertemplate="replay: one forward pass of the target over every context token, "
            "bottom to top; inside the window its attention reads the translated K/V<extra></extra>"))
        notes.append(dict(x=TARGET_X + 0.36, y=target.num_layers / 2, showarrow=False, textangle=-90,
                          text="replay: every layer caches the K/V it computes itself"))
    notes += [
        dict(x=TARGET_X + 0.05, y=1, ax=TARGET_X + 0.5, ay=1, axref="x", ayref="y", showarrow=True, arrowhead=2,
             text="question:<br>read over the cache", xanchor="left"),
        dict(x=TARGET_X + 0.6, y=target.num_layers - 1, ax=TARGET_X + 0.05, ay=target.num_layers - 1, axref="x",
             ayref="y", showarrow=True, arrowhead=2, text="answer", xanchor="left"),
    ]
    for note in notes:
        fig.add_annotation(font=dict(size=11), **note)


def diagram_of(mot, highlight: str | None = None) -> go.Figure:
    """:func:`method_diagram` of a loaded checkpoint (an engine.mot.MoT)."""
    return method_diagram(mot.source, mot.target, mot.channels, mot.translator.config, mot.replay, highlight)


def diagram_caption(translator: TranslatorConfig, replay: ReplayConfig) -> str:
    """The one caption under the picture: what is translated, what the target computes, what it costs."""
    what = {"mot": f"a mixture of {translator.num_experts} expert translators (a router keeps the top "
                   f"{translator.top_k} per token and weighs them; each expert attends across all the context's "
                   "tokens)",
            "single": "one translator (it attends across all the context's tokens)",
            "linear": "a closed-form linear map"}.get(translator.variant, translator.variant)
    if translator.linear_residual and translator.variant != "linear":
        what += " added to a linear map of the window"
    head = ("The source reads the context and keeps its KV cache; its K/V at the window's layers (orange) are "
            f"aligned to the target's tokens and translated into the target's KV space by {what}, one for K and one "
            "for V. ")
    if replay.direct:
        return head + ("The window is every target layer and there is no replay: the translated K/V are the target's "
                       "cache as they are, the target never runs over the context, and every layer's error reaches "
                       "the answer. The target reads the question over that cache and answers.")
    attention = ("dense attention" if replay.topk_sparse_attn is None else
                 f"sparse top-{replay.topk_sparse_attn} attention from layer {replay.num_bottom_full_attn} up")
    return head + ("The target then runs one forward pass of its own over the context tokens (the **replay**, "
                   f"{attention}), so it does not skip its prefill: inside the window its attention reads the "
                   "translated K/V instead of its own, and every layer caches the K/V it computes from its own "
                   "hidden states, so the translation reaches the cache only through them (the first window layer's "
                   "K/V are unchanged by it: its input comes from below). The target reads the question over that "
                   "cache and answers. Hover any part for what it does.")
