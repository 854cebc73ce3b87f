"""The names of the ways of sharing that the evaluations' tables measure every other by, in a module free of torch:
the metrics (eval/qa_metrics.py) read them without loading a model library; the methods' modules and the registry
(registry.py) take their names from here."""

REFERENCE = "native"  # the ceiling of every ratio (retention divides by it): the target reads the context itself
FLOOR = "no_context"  # the floor of every ratio (gap closed counts from it): the question alone
TRANSLATED = "mot"  # the way of sharing every paired test compares with: the MoT's translated window
SECOND = "second"  # python -m mot_viz.eval.evaluate --second: a second checkpoint's MoT, beside the first's
