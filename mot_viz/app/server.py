"""Start the app as a user does (``streamlit run app.py``) on a free localhost port: for the browser test and
the fresh-start benchmark."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from .settings import REPO_ROOT


class AppStartError(RuntimeError):
    """The Streamlit server did not come up."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_app(env: dict[str, str], log: Path | None = None, timeout_s: float = 60.0) -> Iterator[str]:
    """Run the app with environment `env` until the block ends; yields its URL once its health check answers.

    log: file for the server's output (discarded when None). Raises AppStartError when the server does not
    come up within timeout_s.
    """
    port = free_port()
    streamlit = REPO_ROOT / ".venv" / "bin" / "streamlit"
    cmd = [str(streamlit), "run", "app.py"] if streamlit.is_file() else [sys.executable, "-m", "streamlit", "run", "app.py"]
    # headless on a free local port; every other setting (no file watcher, no usage statistics) comes from
    # .streamlit/config.toml, as it does for the README's command
    cmd += ["--server.headless", "true", "--server.port", str(port), "--server.address", "127.0.0.1"]
    out = open(log, "w") if log is not None else subprocess.DEVNULL
    server = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AppStartError(f"the Streamlit server did not come up within {timeout_s:.0f} s "
                                       f"(exit code {server.poll()}); its log: {log or 'not kept'}") from None
                time.sleep(0.25)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        if out is not subprocess.DEVNULL:
            out.close()
