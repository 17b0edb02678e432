"""The documentation's runnable code: README.rst's code blocks and the scripts in examples/.

Examples name the usual local addresses (127.0.0.1:4150 for nsqd's TCP port, :4151 for
its HTTP port, :4161 for nsqlookupd, ``ca.pem``); the tests replace them by their own
processes' before running the code as a user would, in a fresh interpreter.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile

from tests.support.env import REPO
from tests.support.reactors import on_test_reactor

__all__ = ["EXAMPLES", "README", "block_containing", "example", "readme_blocks", "run_python"]

README = REPO / "README.rst"
EXAMPLES = REPO / "examples"
_BLOCK = re.compile(r"^\.\. code-block:: (\w+)\n\n((?:(?:    .*)?\n)+)", re.MULTILINE)


def readme_blocks(language: str) -> list[str]:
    """Return the README's code blocks in ``language``, dedented."""
    text = README.read_text(encoding="utf-8")
    blocks = []
    for match in _BLOCK.finditer(text):
        if match.group(1) == language:
            lines = [line[4:] for line in match.group(2).splitlines()]
            blocks.append("\n".join(lines).strip() + "\n")
    return blocks


def example(name: str) -> str:
    """Return the text of ``examples/<name>``."""
    return (EXAMPLES / name).read_text(encoding="utf-8")


def block_containing(language: str, marker: str) -> str:
    """The one README block or example file (``.py`` for python, ``.sh`` for shell) in
    ``language`` that contains ``marker``.

    :raises ValueError: when none or several contain it.
    """
    suffix = {"python": ".py", "shell": ".sh"}[language]
    candidates = readme_blocks(language) + [
        path.read_text(encoding="utf-8") for path in sorted(EXAMPLES.glob("*" + suffix))
    ]
    [block] = [b for b in candidates if marker in b]
    return block


def run_python(code: str, timeout: float = 60.0) -> str:
    """Run ``code`` in a fresh interpreter (the test's venv); return its stdout.

    :raises AssertionError: when it exits with a non-zero status (with its output).
    """
    result = subprocess.run(
        [sys.executable, "-c", on_test_reactor(code)],
        capture_output=True,
        timeout=timeout,
        cwd=tempfile.gettempdir(),
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"example exited with {result.returncode}:\n{result.stdout.decode()}\n"
            f"{result.stderr.decode()}"
        )
    return result.stdout.decode()
