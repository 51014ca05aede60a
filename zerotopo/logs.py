"""Logging for the ``zerotopo`` command: console lines, a log file in the run directory, warnings once.

[Note: warnings] Library code warns with :func:`warnings.warn` (callers of the Python API can filter or
turn them into errors as usual). The command line routes them into the ``zerotopo`` logger instead of
Python's default printer, so a warning appears once per run, as ``zerotopo: warning: <message>``,
without the ``file.py:123:`` prefix and the source line. Records made before the run directory exists are
buffered and written to its ``train.log`` as soon as it is known.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

LOGGER_NAME = "zerotopo"
LOG_FILE = "train.log"

_MUTED = False  # console output suppressed inside console_muted()


def get_logger(name: str = "") -> logging.Logger:
    """The ``zerotopo`` logger, or its child ``zerotopo.<name>``."""
    return logging.getLogger(f"{LOGGER_NAME}.{name}" if name else LOGGER_NAME)


class _Once(logging.Filter):
    """Drops a warning whose text was logged before (the same condition reported by several code paths or
    several config loads)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or record.levelno >= logging.ERROR:
            return True
        text = record.getMessage()
        if text in self.seen:
            return False
        self.seen.add(text)
        return True


class _ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno >= logging.ERROR:
            return f"zerotopo: error: {text}"
        if record.levelno >= logging.WARNING:
            return f"zerotopo: warning: {text}"
        return text


class _NotMuted(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _MUTED


class _Console(logging.Handler):
    """Info to stdout, warnings and errors to stderr; the streams are looked up per record, so a
    redirected ``sys.stdout`` (tests, notebooks) is honoured."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except BrokenPipeError:  # the stream's reader went away (`| head`): the run's log file keeps the rest
            to_null(stream)
        except Exception:  # noqa: BLE001 - logging must never take the run down
            self.handleError(record)


def to_null(stream) -> None:
    """Point ``stream``'s file descriptor at the null device, once its reader has gone: what it still
    buffers and every later write then vanish instead of raising BrokenPipeError again. A stream without
    a file descriptor (a test's redirection) is left as it is."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError):
        pass


class _Buffer(logging.Handler):
    """Keeps records until the run's log file exists."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    LIMIT = 10_000  # a command that never opens a run directory must not grow without bound

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) < self.LIMIT:
            self.records.append(record)


def _tagged(logger: logging.Logger, tag: str) -> logging.Handler | None:
    return next((h for h in logger.handlers if getattr(h, "_zerotopo", None) == tag), None)


def setup_console(*, verbose: bool = True) -> logging.Logger:
    """Console output of the ``zerotopo`` logger: info to stdout and warnings to stderr when ``verbose``,
    errors only otherwise (the ranks other than 0, whose warnings would repeat rank 0's); Python warnings
    are routed through it once each. Idempotent: a second call changes the level only."""
    logger = get_logger()
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    if not any(isinstance(f, _Once) for f in logger.filters):
        logger.addFilter(_Once())
    console = _tagged(logger, "console")
    if console is None:
        console = _Console()
        console._zerotopo = "console"  # type: ignore[attr-defined]
        console.setFormatter(_ConsoleFormatter())
        console.addFilter(_NotMuted())
        logger.addHandler(console)
        buffer = _Buffer()
        buffer._zerotopo = "buffer"  # type: ignore[attr-defined]
        logger.addHandler(buffer)
    console.setLevel(logging.INFO if verbose else logging.ERROR)
    capture_warnings()
    return logger


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ARG001
    text = str(message)
    if category not in (UserWarning, RuntimeWarning):
        text = f"{text} ({category.__name__})"
    get_logger().warning(text)


def capture_warnings() -> None:
    """Python warnings go to the ``zerotopo`` logger (once each, no source lines) instead of stderr."""
    warnings.showwarning = _show_warning


def attach_run_log(run_dir: Path | str, copies: tuple[Path | str, ...] = ()) -> Path:
    """Write the ``zerotopo`` logger to ``run_dir/train.log`` (appending, so a resumed run continues the
    same file) and to each file of ``copies`` (NeoX's ``log_dir``), starting with what was logged before
    the directory was known."""
    logger = get_logger()
    close_run_log()
    path = Path(run_dir) / LOG_FILE
    buffer = _tagged(logger, "buffer")
    for target in (path, *map(Path, copies)):
        target.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(target, mode="a", encoding="utf-8")
        handler._zerotopo = "file"  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        for record in buffer.records if buffer is not None else ():
            handler.handle(record)
        logger.addHandler(handler)
    if buffer is not None:
        logger.removeHandler(buffer)
    return path


def close_run_log() -> None:
    logger = get_logger()
    for handler in [h for h in logger.handlers if getattr(h, "_zerotopo", None) == "file"]:
        logger.removeHandler(handler)
        handler.close()


@contextlib.contextmanager
def console_muted() -> Iterator[None]:
    """Inside: records reach the log file but not the console (warnings the launching process has
    already shown)."""
    global _MUTED
    before, _MUTED = _MUTED, True
    try:
        yield
    finally:
        _MUTED = before


def terminal_columns(stream=None) -> int | None:
    """Columns of the terminal behind ``stream`` (stderr by default), or None when it does not say: a
    pseudo-terminal that nobody sized (``script``, some batch consoles and CI runners) reports 0 columns,
    and a progress bar sized to that draws nothing."""
    stream = sys.stderr if stream is None else stream
    try:
        cols = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return None
    return cols or None


def on_terminal(stream=None) -> bool:
    """Whether ``stream`` (stderr, where a progress bar draws) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
