"""Files written so a crash never leaves half of them: temporary names carry the writer's PID, and
leftovers of dead writers are removed by the next process that looks (run folders, model cache, banks). The output
contract every command obeys before any work (check_out_place), and paths read from the checkout (checkout_path)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from .errors import ConfigError

CHECKOUT = Path(__file__).resolve().parents[1]  # the checkout (or install) holding mot_viz/
# "<name>.tmp-<pid>", "<name>.old-<pid>", "<name>.work-<pid>": what an atomic write leaves while it runs
_TEMP_NAME = re.compile(r"^(?P<base>.+)\.(?P<kind>tmp|old|work)-(?P<pid>\d+)$")


def pid_alive(pid: int) -> bool:
    """True when a process with this PID exists on this machine (signal 0 checks without sending)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def temp_parts(path: Path) -> tuple[str, str, int] | None:
    """(base name, kind, pid) of a temporary name written by an atomic write, else None."""
    m = _TEMP_NAME.match(path.name)
    return (m["base"], m["kind"], int(m["pid"])) if m else None


def stale_temporaries(folder: Path) -> list[Path]:
    """Temporary files and folders in folder whose writing process is gone (never this process's own)."""
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.iterdir()):
        parts = temp_parts(p)
        if parts and parts[2] != os.getpid() and not pid_alive(parts[2]):
            out.append(p)
    return out


def remove_stale_temporaries(folder: Path, keep=lambda path: False) -> list[Path]:
    """Delete what stale_temporaries finds, except paths keep(path) spares; returns what was deleted."""
    removed = []
    for p in stale_temporaries(folder):
        if keep(p):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def short_path(path: str | Path, most: int = 120) -> str:
    """A path as a message quotes it: whole up to `most` characters, else its start and end around "…" and its
    length (a pasted path may be thousands of characters long)."""
    text = str(path)
    return text if len(text) <= most else f"{text[:most // 2]}…{text[-(most // 3):]} ({len(text):,} characters)"


def named(names: list[str], most: int = 3) -> str:
    """Names as one message lists them: the first `most`, then how many more."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def check_out_place(path: Path, flag: str = "--out", folder: bool = True, ours=None, overwrite: bool = False) -> None:
    """Raise ConfigError unless this command may write `path` (`flag` names it in the message): a folder, or with
    folder=False a file. Checked before any model loads or any work starts, so a long job never fails at its end;
    nothing is created here (a refused command leaves nothing behind). Every command that writes calls it.

    ours(p): whether the existing path p (an entry of the folder, or the file itself) is one this command writes and
    may replace. Anything else there (a user's file) is refused, listed, unless `overwrite` (the command's
    --overwrite). ours=None: the caller checks what the place holds itself (the results folders)."""
    path = Path(path)
    try:
        existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    except (OSError, ValueError) as exc:  # a name too long for the system, a NUL in it
        raise ConfigError(f"{flag} {short_path(path)} cannot be a path ({getattr(exc, 'strerror', None) or exc}). "
                          "Pass a shorter one.") from exc
    if existing != path and not existing.is_dir():
        raise ConfigError(f"{flag} {path} lies inside the file {existing}. Pass a "
                          f"{'folder (it is created when missing)' if folder else 'path in a folder'}.")
    if folder and not existing.is_dir():
        raise ConfigError(f"{flag} {path} is a file. Pass a folder (it is created when missing).")
    if not folder and path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder. Pass a file's path, e.g. {path / 'out.md'}.")
    place = existing if existing.is_dir() else existing.parent
    try:
        tempfile.TemporaryFile(dir=place).close()
    except OSError as exc:
        raise ConfigError(f"Cannot write into {flag} {path} ({exc.strerror}). Pass a "
                          f"{'folder' if folder else 'path'} you can write to.") from exc
    if ours is None or overwrite or existing != path:
        return
    if not folder:
        if not ours(path):
            raise ConfigError(f"{flag} {path} is a file this command did not write, which it would replace. Pass "
                              "another path, or --overwrite to replace it.")
        return
    foreign = sorted(p.name for p in path.iterdir() if not ours(p))
    if foreign:
        raise ConfigError(f"{flag} {path} holds files this command did not write ({named(foreign)}), which it would "
                          "replace. Pass a new or empty folder, or --overwrite to replace them.")


def text_file(path: Path) -> bool:
    """Whether the file at path reads as UTF-8 text (a report a command keeps the other parts of)."""
    try:
        path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return True


@contextlib.contextmanager
def removed_on_failure(*paths: Path):
    """Remove these temporary paths (files or folders) when the block fails in any way, Ctrl-C included: no
    temporary file outlives a failed command."""
    try:
        yield
    except BaseException:
        for p in paths:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        raise


def checkout_path(path: str | Path) -> Path:
    """A path as given when it exists, else the same relative path from the checkout holding this package (a results
    folder copied elsewhere names its checkpoint relative to the checkout; a command's default files live there)."""
    path = Path(path)
    try:
        return path if path.exists() or path.is_absolute() or not (CHECKOUT / path).exists() else CHECKOUT / path
    except (OSError, ValueError):  # a name the system cannot take: the reader of the path names it
        return path


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small text file so a reader sees the old content or the new one, never a torn one."""
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


NUL_STAND_IN = "\ufffd"  # what a NUL character of a text field is written as (U+FFFD, the replacement character)


def csv_text(value):
    """A text field as the results' CSV files hold it: a carriage return becomes a line break (the CSV writer quotes
    fields holding its line terminator "\\n" but not a lone "\\r", which every reader then takes for the end of the
    row), and a NUL becomes U+FFFD (NUL_STAND_IN: a file holding NUL reads as binary to many tools). A model's answer
    or message may hold either, and so may a user's gold answer ("Paris\\u0000" is valid JSON). Other values as
    they are."""
    if not isinstance(value, str) or ("\r" not in value and "\x00" not in value):
        return value
    return value.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", NUL_STAND_IN)


def write_csv_atomic(path: Path, frame, **to_csv) -> None:
    """Write a DataFrame as CSV (no index) with write_text_atomic, its text fields as csv_text writes them."""
    text_columns = frame.select_dtypes(include="object").columns
    if len(text_columns):
        frame = frame.copy()
        for column in text_columns:
            frame[column] = frame[column].map(csv_text)
    write_text_atomic(path, frame.to_csv(index=False, **to_csv))
