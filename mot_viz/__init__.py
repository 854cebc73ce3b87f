"""MoT Viz: translate one LLM's KV cache into another's (Mixture-of-Translators) and look inside.

The wings, in the order data flows; each imports only the wings above it (and the shared ``errors``, ``cli`` and
``fsutil`` modules here):

* ``engine`` — models, tokens, translators, translate and replay;
* ``data`` — evaluation sets and training text, offline first;
* ``train`` — banks, fits, the training loop, export, quick fits;
* ``eval`` — answers under each cache, scores, fidelity, the reuse verdict;
* ``analysis`` — cache metrics, figures, the expert what-if, the shift analysis;
* ``app`` — the Streamlit app's shared parts (the only wing that imports Streamlit).
"""

from . import cli  # noqa: F401  (the mot_viz logger's default stderr handler)
