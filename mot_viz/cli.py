"""One convention for every command line and every progress message.

Progress goes through the ``mot_viz`` logger (``cli.logger(__name__)``, i.e. ``mot_viz.<module>``), which prints
``[mot_viz.<module>] message`` on stderr at INFO unless the application configures logging itself. A
command's ``main`` runs under ``run_cli``: a user error (MotVizError) is one line, ``error: <Type>: <message
with its fix>``, and exit status 2; Ctrl-C is status 130. Flags use underscores and every flag has help.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable

from .errors import MotVizError

LOGGER = logging.getLogger("mot_viz")


def _default_handler() -> None:
    if not LOGGER.handlers:  # an application that configured the logger keeps its own setup
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        LOGGER.addHandler(handler)
        LOGGER.setLevel(logging.INFO)
        LOGGER.propagate = False


_default_handler()


def logger(name: str) -> logging.Logger:
    """The logger of module `name` (pass ``__name__``), under the ``mot_viz`` logger and its handler.

    ``python -m mot_viz.train.train`` runs the module as ``__main__``, whose logger has no handler: its
    spec still holds the real name, so a command logs as ``mot_viz.train.train`` however it was started.
    """
    if name == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        name = spec.name if spec is not None else LOGGER.name
    return logging.getLogger(name)


def error_line(exc: MotVizError) -> str:
    """How every command reports a user error."""
    return f"error: {type(exc).__name__}: {exc}"


def _interruptible() -> Callable[[], None]:
    """Let Ctrl-C (SIGINT) stop the command even when it was started with SIGINT ignored, as every process started by
    a background job of a shell without job control is (``cmd &`` in a script, ``nohup streamlit run app.py &``):
    Python then installs no KeyboardInterrupt handler, and the app's Stop button or a user's Ctrl-C would go unheard.
    Returns what puts the ignored disposition back (nothing to do in any other case)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        return lambda: None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_cli(main: Callable[[], int | None]) -> int:
    """Run a command's body; returns its exit status (0, 2 for a user error, 130 for Ctrl-C)."""
    restore = _interruptible()
    try:
        return main() or 0
    except MotVizError as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        restore()
