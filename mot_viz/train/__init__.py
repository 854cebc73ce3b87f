"""Training a translator: the cached bank of source / target windows (``bank``), closed-form ridge maps (``ridge``),
fitting on a bank (``fit``), the Context Correction Loss loop (``train``, its ``config`` and run folders ``runs``),
exporting a run as a shipped checkpoint (``export``) and the one-minute linear fit of any pair (``quickfit``)."""
