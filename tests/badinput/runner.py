"""Run corpus cases: in-process (the fast test) or as subprocesses with a timeout (the script)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from corpus import ROOT, Case, base_environment, classify

#: Printed (and exit status 0) instead of starting ranks: a case that gets this far was accepted.
ACCEPTED = "ACCEPTED: the ranks would start now"

_NO_SPAWN = f"""
import sys
import zerotopo.launch.spawn as spawn_module

def refuse(*args, **kwargs):
    print({ACCEPTED!r})
    raise SystemExit(0)

spawn_module.spawn = refuse
from zerotopo.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


class _Accepted(BaseException):
    pass


def run_in_process(case: Case, tmp: Path) -> tuple[str, str]:
    """(outcome, output) of ``case`` run by calling the CLI's ``main`` in this process."""
    import zerotopo.launch.spawn as spawn_module
    from zerotopo.cli.main import main

    inv = case.build(tmp)
    saved_env = dict(os.environ)
    saved_spawn = spawn_module.spawn
    out, err = io.StringIO(), io.StringIO()

    def refuse(*args, **kwargs):
        raise _Accepted()

    code: int | None
    try:
        os.environ.clear()
        os.environ.update(base_environment_from(saved_env))
        os.environ.update(inv.env)
        spawn_module.spawn = refuse
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(inv.argv)
            except SystemExit as exc:  # argparse
                code = exc.code if isinstance(exc.code, int) else 1
            except _Accepted:
                code = 0
                print(ACCEPTED)
            except BaseException as exc:  # noqa: BLE001 - an escaped exception is a traceback
                import traceback

                traceback.print_exc()
                code = 1 if not isinstance(exc, KeyboardInterrupt) else 130
    finally:
        spawn_module.spawn = saved_spawn
        os.environ.clear()
        os.environ.update(saved_env)
    output = out.getvalue() + err.getvalue()
    return classify(code, output, inv.marker), output


def base_environment_from(env: dict[str, str]) -> dict[str, str]:
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        return base_environment()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_subprocess(case: Case, timeout_s: float = 120.0) -> tuple[str, str]:
    """(outcome, output) of ``case`` run as ``zerotopo`` in a fresh Python process, killed after
    ``timeout_s`` (a hang)."""
    with tempfile.TemporaryDirectory(prefix=f"badinput-{case.name}-") as tmp:
        inv = case.build(Path(tmp))
        env = {**base_environment(), **inv.env, "PYTHONPATH": str(ROOT)}
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _NO_SPAWN, *inv.argv],
                capture_output=True,
                text=True,
                errors="replace",
                env=env,
                cwd=tmp,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
            code: int | None = proc.returncode
            output = proc.stdout + proc.stderr
        except OSError as exc:  # the case could not even start (an environment too large for exec)
            return "traceback", f"harness: {exc}"
        except subprocess.TimeoutExpired as exc:
            code = None
            output = (
                (exc.stdout or b"").decode(errors="replace")
                if isinstance(exc.stdout, bytes)
                else str(exc.stdout or "")
            )
        return classify(code, output, inv.marker), output
