"""The virtual environment the asyncnsq runs of :mod:`benchmarks.compare` need.

asyncnsq needs Python 3.12 or newer, txnsq's own environment may be older, and its runner
(:mod:`benchmarks._runners`) needs nothing but the standard library and asyncnsq: so
:func:`asyncnsq_python` makes ``.venv-bench-3.12`` at the top of the checkout, with the
asyncnsq that setup.cfg's ``bench`` extra pins, installed from the package index, and
returns its interpreter. Python 3.12 is found as ``scripts/test`` finds it:
``python3.12`` on ``PATH``, else pyenv's newest 3.12.x.

asyncnsq's wheel also installs top-level packages named ``benchmarks`` and ``examples``
into the environment: the runners are started with ``python -m benchmarks._runners`` in
the checkout, whose own ``benchmarks`` comes first on ``sys.path``.

The environment is made once and installed again only when the pin changes (a stamp
file). Runs side by side (CI's test runs) wait for each other on a lock of the
environment's directory rather than install into it at once.
"""

from __future__ import annotations

import configparser
import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION = "3.12"
VENV = REPO / f".venv-bench-{VERSION}"
#: Where the environment records what it was installed with.
STAMP = ".bench-installed"


class EnvError(Exception):
    """The environment could not be made; the message says why and what to do."""


def requirement(name: str) -> str:
    """The requirement for ``name`` in setup.cfg's ``bench`` extra, as written there
    (with its environment marker)."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg", encoding="utf-8")
    for line in config["options.extras_require"]["bench"].splitlines():
        if re.match(rf"{re.escape(name)}\s*[=<>!~;\[]", line.strip()):
            return line.strip()
    raise EnvError(f"setup.cfg's bench extra has no requirement for {name}")


def _version_of(interpreter: str) -> str:
    try:
        done = subprocess.run(
            [interpreter, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return ""
    return done.stdout.strip()


def find_python(version: str = VERSION) -> str | None:
    """An interpreter of Python ``version``: ``pythonX.Y`` on ``PATH``, else pyenv's
    newest ``X.Y.z``; ``None`` when there is neither."""
    candidates = [shutil.which(f"python{version}")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        listed = subprocess.run(
            [pyenv, "versions", "--bare"], capture_output=True, text=True, check=False
        ).stdout.split()
        pattern = re.compile(rf"^{re.escape(version)}\.(\d+)$")
        matches = [(int(m.group(1)), v) for v in listed if (m := pattern.match(v))]
        if matches:
            newest = max(matches)[1]
            prefix = subprocess.run(
                [pyenv, "prefix", newest], capture_output=True, text=True, check=False
            ).stdout.strip()
            candidates.append(f"{prefix}/bin/python{version}")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and _version_of(candidate) == version:
            return candidate
    return None


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise EnvError(f"{what} failed ({done.returncode}): {done.stderr.strip()[-1500:]}")


def asyncnsq_python() -> str:
    """The interpreter of ``.venv-bench-3.12``, made (or brought up to the pin) first.

    Raises :class:`EnvError` when Python 3.12 cannot be found or the install fails.
    """
    pin = requirement("asyncnsq")
    python = VENV / "bin" / "python"
    VENV.mkdir(exist_ok=True)
    fd = os.open(VENV, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        stamp = VENV / STAMP
        if python.exists() and _version_of(str(python)) != VERSION:
            stamp.unlink(missing_ok=True)
            python.unlink()  # made again below, by Python 3.12, over the old contents
        if not python.exists():
            interpreter = find_python()
            if interpreter is None:
                raise EnvError(
                    f"Python {VERSION} not found (python{VERSION} on PATH, or pyenv); "
                    f"asyncnsq needs it"
                )
            _run([interpreter, "-m", "venv", "--clear", str(VENV)], f"making {VENV.name}")
        if not stamp.exists() or stamp.read_text() != pin:
            pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            _run([*pip, pin], f"pip install {pin!r} into {VENV.name}")
            stamp.write_text(pin)
    finally:
        os.close(fd)  # and with it the lock
    return str(python)
