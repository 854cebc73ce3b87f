"""Permalinks: the app's applied selection and page options as URL query parameters, and back; "Copy as Python".

Pure functions (no Streamlit): mot_viz.app.links reads and writes ``st.query_params`` through them.

A link holds the *applied* sidebar choice under short keys — ``src``, ``tgt``, ``ckpt``, then either a dataset
example (``ds``, ``ex``) or free text (``text``, or ``th`` = its sha256 prefix when longer than
:data:`MAX_TEXT_IN_LINK` characters or :data:`MAX_TEXT_QUERY_CHARS` once percent-encoded; ``q``, ``gold``) — and
every page option (a widget key ``pg.<page>.<name>``) under ``<page>.<name>`` (a text too long to carry, e.g. a
document pasted on a page, as ``sha256:<digest>``, restored like ``th``). Page option values keep their type:
a string is written as is unless it would read back as a number, a boolean or a list (then JSON-quoted); numbers,
booleans and lists are JSON. A link's query string stays within :data:`MAX_QUERY_CHARS` (:func:`fit_link`), so the
app's server accepts it.

A link never makes the app load something a user did not choose from its lists: a model name that is not bundled
or a checkpoint that is not in pretrained/ is reported (and offered under "other"), not loaded.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote_plus, urlencode

MAX_TEXT_IN_LINK = 1000  # longer free text is linked by its sha256 prefix (URLs stay short enough to paste)
MAX_TEXT_QUERY_CHARS = 4 * 1024  # and so is text that percent-encodes longer (up to 12 characters per character)
# The app's server (Streamlit 1.67 on uvicorn's h11 parser) answers 400 Bad Request when a request's head (request
# line and headers) is still incomplete past 16 KiB. Measured with mot_viz.app.server.serve_app and a request sent
# in 1,460-byte pieces, as a network carries it: a 17,210-byte path loads, 17,211 fails (larger pieces, as on
# localhost, pass more: do not measure with one send). A browser sends the page's address once per request (as the
# path, or as the Referer of each file the page loads) beside 1-2 KiB of other headers and cookies: 4 KiB are left.
MAX_QUERY_CHARS = 12 * 1024
DIGEST_CHARS = 16  # hex characters of the sha256 prefix: 64 bits, never guessed
FINGERPRINT = "sha256:"  # a page option's text too long to carry goes in a link as "sha256:<digest>" (like ``th``)
_FINGERPRINTED = re.compile(f"^{FINGERPRINT}[0-9a-f]{{{DIGEST_CHARS}}}$")
# a fingerprint with fewer hex characters is the end of a link cut short (a chat or mail program cut the address)
_CUT_FINGERPRINT = re.compile(f"^{FINGERPRINT}[0-9a-f]{{0,{DIGEST_CHARS - 1}}}$")
_DIGEST = re.compile(f"^[0-9a-f]{{{DIGEST_CHARS}}}$")
CUT_SHORT = "the link was cut short (copy it again, whole)"
PAGE_PREFIX = "pg."  # page widget keys; in a link without the prefix
SIDEBAR_KEYS = ("src", "tgt", "ckpt", "ds", "ex", "text", "th", "q", "gold")
_PAGE_KEY = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)+$")  # "error.metric"
_INDEX = re.compile(r"^[0-9]{1,9}$")

Scalar = str | int | float | bool
PageValue = Scalar | list


@dataclass(frozen=True)
class SidebarLink:
    """The applied sidebar choice a link carries; None where the link says nothing (the app's default applies)."""

    source: str | None = None  # model name
    target: str | None = None
    checkpoint: str | None = None  # a checkpoint folder name in pretrained/ (a typed path is not restored)
    dataset: str | None = None  # dataset context: the dataset and the example index
    example: int | None = None
    text: str | None = None  # free-text context (the typed text, before any chat header)
    question: str | None = None
    gold: str | None = None


@dataclass
class ParsedLink:
    """What a link's query parameters restore, and what of it was ignored (one line each, for the warning)."""

    sidebar: SidebarLink
    page: dict[str, PageValue] = field(default_factory=dict)  # widget key ("pg.error.metric") -> value
    typed: dict[str, str] = field(default_factory=dict)  # "source"/"target"/"checkpoint" -> a name not restored
    ignored: list[str] = field(default_factory=list)


def text_in_link(text: str) -> bool:
    """Whether a link carries this free text itself (else its digest, ``th``)."""
    return len(text) <= MAX_TEXT_IN_LINK and len(quote_plus(text)) <= MAX_TEXT_QUERY_CHARS


def text_digest(text: str) -> str:
    """The sha256 prefix a link holds for a free text too long to carry."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_CHARS]


# ----- values ----------------------------------------------------------------------------------------


def _reject_constant(name: str) -> float:
    raise ValueError(name)  # NaN / Infinity are not values any widget holds


def _json_value(raw: str) -> tuple[bool, object]:
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except ValueError:
        return False, None
    return True, value


def _is_scalar(value: object) -> bool:
    if isinstance(value, str):  # JSON's "\ud800" escape makes a lone surrogate, which no page or URL can hold
        return value.isascii() or not any("\ud800" <= c <= "\udfff" for c in value)
    return isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value))


def encode_value(value: object) -> str | None:
    """A page option's value as a query parameter (None for a value a link cannot carry, e.g. a tuple)."""
    if isinstance(value, str):
        if not _is_scalar(value):  # a lone surrogate: no URL can hold it
            return None
        parses, _ = _json_value(value)
        # "1" stays a string: '"1"'; so does a text that looks like a fingerprint
        return json.dumps(value) if parses or _FINGERPRINTED.match(value) else value
    if _is_scalar(value) or (isinstance(value, list) and all(_is_scalar(v) for v in value)):
        return json.dumps(value)
    return None


def decode_value(raw: str) -> PageValue:
    """The inverse of :func:`encode_value`; anything not read as a number, boolean, list or quoted string is text."""
    parses, value = _json_value(raw)
    if parses and (_is_scalar(value) or (isinstance(value, list) and all(_is_scalar(v) for v in value))):
        return value
    return raw


def _same_kind(value: object, default: object) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def check_value(value: object, default: object, options: Collection | None = None) -> tuple[bool, object]:
    """Whether a linked value fits a widget whose default is `default` (and whose choices are `options`).

    Returns (fits, value): an int given for a float widget comes back as a float.
    """
    if default is None:
        return True, value
    if not _same_kind(value, default):
        return False, None
    if isinstance(default, float):
        value = float(value)
    if isinstance(default, list):
        if default and not all(_same_kind(v, default[0]) for v in value):
            return False, None
        if options is not None and not all(v in options for v in value):
            return False, None
    elif options is not None and value not in options:
        return False, None
    return True, value


# ----- links -----------------------------------------------------------------------------------------


def sidebar_params(link: SidebarLink) -> dict[str, str]:
    """The query parameters of an applied sidebar choice (free text longer than the limit by its digest)."""
    params = {}
    for key, value in (("src", link.source), ("tgt", link.target), ("ckpt", link.checkpoint)):
        if value:
            params[key] = value
    if link.text is not None:
        if text_in_link(link.text):
            params["text"] = link.text
        else:
            params["th"] = text_digest(link.text)
        for key, value in (("q", link.question), ("gold", link.gold)):
            if value:
                params[key] = value
    elif link.dataset is not None:
        params["ds"] = link.dataset
        if link.example is not None:
            params["ex"] = str(link.example)
    return params


def page_params(values: Mapping[str, object]) -> dict[str, str]:
    """The query parameters of every page option (``pg.*`` key) in `values` that a link can carry; a text too long
    for a link (:func:`text_in_link`, e.g. a pasted document) by its fingerprint, ``sha256:<digest>``."""
    params = {}
    for key in sorted(values):
        if isinstance(key, str) and key.startswith(PAGE_PREFIX) and _PAGE_KEY.match(key[len(PAGE_PREFIX):]):
            value = values[key]
            long_text = isinstance(value, str) and _is_scalar(value) and not text_in_link(value)
            encoded = FINGERPRINT + text_digest(value) if long_text else encode_value(value)
            if encoded is not None:
                params[key[len(PAGE_PREFIX):]] = encoded
    return params


def query_string(params: Mapping[str, str]) -> str:
    """``?key=value&…`` (what to append to the app's address), or "" without parameters."""
    return "?" + urlencode(params) if params else ""


def fit_link(params: Mapping[str, str], limit: int = MAX_QUERY_CHARS) -> tuple[dict[str, str], list[str]]:
    """The parameters whose query string fits in `limit` characters, and the keys left out to fit (longest first).

    Only a value no link should carry is ever that long (a free text goes by its digest): a pasted question or gold
    answer, a typed model path.
    """
    kept = dict(params)
    left_out = []
    while len(query_string(kept)) > limit:
        key = max(kept, key=lambda k: len(quote_plus(k)) + len(quote_plus(kept[k])))
        left_out.append(key)
        del kept[key]
    return kept, left_out



def example_link(view) -> str | None:
    """The address, relative to the app, of an example's view (analysis.eval_run_links.AppView): its page's path as
    the navigation names it, the sidebar's pair, checkpoint and dataset example, and the page's options; None when
    the app cannot show it (the view's reason says why)."""
    if view.page is None:
        return None
    sidebar = sidebar_params(SidebarLink(view.source, view.target, view.checkpoint, dataset=view.dataset,
                                         example=view.example))
    params, _ = fit_link({**sidebar, **page_params(view.options)})
    return "./" + page_path(view.page) + query_string(params)


def page_path(page_file: str) -> str:
    """A page's path in the app's address, as the navigation names it: its file's stem less its leading number."""
    return re.sub(r"^[0-9]+_", "", Path(page_file).stem)


def _short(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "…")


def parse_link(params: Mapping[str, str], *, models: Collection[str], checkpoints: Collection[str],
               datasets: Collection[str], examples: int,
               recall_text: Callable[[str], str | None] = lambda digest: None,
               option_groups: Collection[str] | None = None) -> ParsedLink:
    """What a link restores: validated sidebar values and decoded page options; the rest is named in `ignored`.

    `models`: the names a link may load (the bundled ones; a typed Hub id or path is never loaded from a link,
    only offered in `typed`); `checkpoints`: the checkpoint folder names; `examples`: how many examples each
    dataset offers; `recall_text`: the text of a digest this process has seen, if any; `option_groups`: the
    ``<page>`` parts of the page options the app has (None: any).
    """
    ignored: list[str] = []
    typed: dict[str, str] = {}
    found: dict[str, object] = {}
    for key, role in (("src", "source"), ("tgt", "target")):
        if key in params:
            if params[key] in models:
                found[role] = params[key]
            else:
                typed[role] = params[key]
                ignored.append(f"{role} model {_short(params[key])} (a link loads only the bundled models "
                               f"{', '.join(models)}: choose “other” in the sidebar to load it)")
    if "ckpt" in params:
        if params["ckpt"] in checkpoints:
            found["checkpoint"] = params["ckpt"]
        else:
            typed["checkpoint"] = params["ckpt"]
            ignored.append(f"checkpoint {_short(params['ckpt'])} (not among the checkpoints here; a link loads no "
                           "other folder: choose “other” in the sidebar to load it)")

    free = "text" in params or "th" in params
    text = params.get("text")
    if text is None and "th" in params and not _DIGEST.match(params["th"]):
        ignored.append(f"the context text (its fingerprint th={_short(params['th'], 20)} is not {DIGEST_CHARS} hex "
                       f"characters: {CUT_SHORT})")
    elif text is None and "th" in params:
        text = recall_text(params["th"])
        if text is None:
            ignored.append(f"the context text (longer than {MAX_TEXT_IN_LINK:,} characters, so the link holds only "
                           f"its fingerprint sha256:{params['th'][:DIGEST_CHARS]}, and this app has not seen it "
                           "since it started): paste the text under Free text in the sidebar")
    if text is not None:
        found.update(text=text, question=params.get("q", ""), gold=params.get("gold", ""))
    if free and ("ds" in params or "ex" in params):
        ignored.append("the dataset example (the link also holds free text)")
    elif not free:
        if "ds" in params and params["ds"] not in datasets:
            ignored.append(f"dataset {_short(params['ds'])} (built-in: {', '.join(datasets)})")
        elif "ds" in params or "ex" in params:
            found["dataset"] = params.get("ds")
            if "ex" in params:
                raw = params["ex"]
                if _INDEX.match(raw) and int(raw) < examples:
                    found["example"] = int(raw)
                else:
                    ignored.append(f"example index {_short(raw)} (a whole number from 0 to {examples - 1})")
        for key in ("q", "gold"):
            if key in params:
                ignored.append(f"{key} (a question and gold answer go with free text only)")

    page: dict[str, PageValue] = {}
    for key, raw in params.items():
        if key in SIDEBAR_KEYS:
            continue
        if _PAGE_KEY.match(key) and option_groups is not None and key.split(".")[0] not in option_groups:
            ignored.append(f"the page option {_short(key, 30)} (no page of this app has it)")
        elif _PAGE_KEY.match(key) and _CUT_FINGERPRINT.match(raw):
            ignored.append(f"the page option {_short(key, 30)} (its text's fingerprint {raw} is not {DIGEST_CHARS} "
                           f"hex characters: {CUT_SHORT})")
        elif _PAGE_KEY.match(key) and _FINGERPRINTED.match(raw):  # a long text: restored where this app saw it
            text = recall_text(raw[len(FINGERPRINT):])
            if text is None:
                ignored.append(f"the page option {_short(key, 30)} (a text too long for a link, so the link holds "
                               f"only its fingerprint {raw}, and this app has not seen it since it started): paste "
                               "the text again on its page")
            else:
                page[PAGE_PREFIX + key] = text
        elif _PAGE_KEY.match(key):
            page[PAGE_PREFIX + key] = decode_value(raw)
        else:
            ignored.append(f"unknown parameter {_short(key, 30)}")
    return ParsedLink(SidebarLink(**found), page, typed, ignored)


# ----- the translation as library code ---------------------------------------------------------------


def python_snippet(source: str, target: str, checkpoint: str, *, dataset: str | None = None,
                   example: int | None = None, text: str | None = None, examples_per_dataset: int,
                   max_context_tokens: int) -> str:
    """Library code that translates exactly the app's context for this selection and prints per-layer numbers.

    The context is the app's: a dataset example's ``build_prompt(example, target.chat_frame).context_text`` from
    ``load_dataset(name, n=examples_per_dataset, seed=0)``, or the typed text after a chat-tuned target's chat
    header; the numbers are the Per-layer cache error page's (``cache_error_table``), for the replayed cache
    (``translation.mixed_kv``) against the target's native cache (``translation.native_kv``).
    """
    lines = [
        "from mot_viz.analysis.cache_metrics import cache_error_table",
        "from mot_viz.engine.checkpoint import load_checkpoint",
        *(["from mot_viz.data.eval_data import load_dataset"] if dataset is not None else []),
        "from mot_viz.engine.models import load_model",
        "from mot_viz.engine.mot import translate",
        "from mot_viz.engine.prompts import build_prompt" if dataset is not None else "from mot_viz.engine.prompts import PLAIN",
        "",
        f"source, target = load_model({source!r}), load_model({target!r})",
        f"mot, config = load_checkpoint({checkpoint!r}, source, target)",
    ]
    if dataset is not None:
        lines += [f"example = load_dataset({dataset!r}, n={examples_per_dataset}, seed=0)[{example or 0}]",
                  "text = build_prompt(example, target.chat_frame).context_text  # a chat-tuned target: its template"]
    else:
        lines += [f"context = {text or ''!r}",
                  "text = (target.chat_frame or PLAIN).head + context  # a chat-tuned target: its chat header first"]
    lines += [
        f"translation = translate(mot, source, target, text, max_tokens=min({max_context_tokens}, "
        "target.spec.max_positions))",
        "table = cache_error_table(translation, mot.channels)  # the Per-layer cache error page's numbers",
        "# per target layer: the replayed cache (translation.mixed_kv) against the native one (translation.native_kv)",
        'replayed = table[table["comparison"] == "replayed"].pivot(index="layer", columns="kv", '
        'values=["cosine", "rel_l2"])',
        "print(replayed.to_string(float_format=lambda x: f\"{x:.6f}\"))",
    ]
    return "\n".join(lines) + "\n"
