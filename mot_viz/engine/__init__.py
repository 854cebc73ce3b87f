"""The engine: load models, run the source, align tokens, translate (experts + router), replay into the target.

Everything else builds on it: ``hf`` (the one package that talks to transformers), ``models`` / ``model_cache``
(loading and the converted-model cache), ``prompts``, ``alignment``, ``layout`` (per-layer K/V ↔ translator blocks),
``channels`` (which source layer feeds which target layer), ``translator`` (experts, router, the linear map), ``mot``
(translate and replay: ``translate(mot, source, target, text) -> Translation``), ``controls`` (control windows),
``checkpoint`` (save / load a MoT) and ``testing`` (tiny random models of every family)."""
