"""Analysis behind the app's pages: per-layer cache metrics (``cache_metrics``), plotly figures (``figures``), the
expert what-if (``whatif``) and propagated versus last-state shift (``shift``)."""
