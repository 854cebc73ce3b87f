"""Evaluation: what the target answers from each cache (``answers``), scored (``qa_metrics``) and reported
(``evaluate``, ``report``), window fidelity against the mean-vector baseline (``fidelity``) and the reuse verdict
(``verdict``)."""
