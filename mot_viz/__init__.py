"""MoT Viz: translate one LLM's KV cache into another's (Mixture-of-Translators) and look inside."""

from . import cli  # noqa: F401  (the mot_viz logger's default stderr handler)
