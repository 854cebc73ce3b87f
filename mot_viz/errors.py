"""Errors a user can cause. Each carries the fix in its message; the app shows it instead of a traceback."""


class MotVizError(Exception):
    """Base class of every error MoT Viz raises on purpose."""

    title = "Problem"  # the heading the app shows above the message


class ModelLoadError(MotVizError):
    """A model name, path or architecture that cannot be loaded here."""

    title = "The model could not be loaded"


class CheckpointError(MotVizError):
    """A checkpoint that is corrupt, incomplete, unsafe, or made for another model pair."""

    title = "Checkpoint problem"


class ContextError(MotVizError):
    """A context that is empty or longer than a model allows."""

    title = "Context problem"


class TranslationError(MotVizError):
    """A translation that produced non-finite K/V: never passed on to a page or a score."""

    title = "Translation problem"


class ConfigError(MotVizError):
    """A configuration value outside its valid range."""

    title = "Configuration problem"


class DataUnavailableError(MotVizError):
    """A dataset, split or data package that is not installed or cannot be found."""

    title = "Dataset unavailable"


class DataFormatError(MotVizError):
    """A data file whose rows are malformed or that holds no usable example."""

    title = "Dataset problem"
