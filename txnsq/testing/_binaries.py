"""Where the ``nsqd`` and ``nsqlookupd`` programs that :mod:`txnsq.testing` runs are.

One place is searched, the first that is given: the directory the caller names, the
directory in ``$NSQ_BIN_DIR``, or ``PATH``. A directory that was named is never
silently replaced by ``PATH``: a suite run against a chosen nsqd version (``NSQ_BIN_DIR``
pointing at it) must not pass against another one found elsewhere.

Private: the public face is :mod:`txnsq.testing`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["BIN_DIR_VARIABLE", "BinaryNotFoundError", "find_binary"]

#: The environment variable naming the directory that holds ``nsqd`` and ``nsqlookupd``.
BIN_DIR_VARIABLE = "NSQ_BIN_DIR"

_HOW_TO_GET = (
    "nsq's release archives (the releases page of the nsqio/nsq project on GitHub) have "
    "nsqd and nsqlookupd in their bin/ directory; `brew install nsq` or your "
    "distribution's nsq package installs them too. Put that directory on PATH or set "
    f"{BIN_DIR_VARIABLE} to it (or give it as bin_dir= to txnsq.testing, as "
    "--nsq-bin-dir to its pytest plugin)"
)


class BinaryNotFoundError(FileNotFoundError):
    """``nsqd`` or ``nsqlookupd`` is not where :mod:`txnsq.testing` was told to look.

    The message names the program, the place searched and how that place was chosen
    (``bin_dir=``, ``$NSQ_BIN_DIR`` or ``PATH``), and how to get the programs.
    """


def find_binary(name: str, bin_dir: str | os.PathLike[str] | None = None) -> str:
    """Return the absolute path of the program ``name`` (``"nsqd"``, ``"nsqlookupd"``).

    :param bin_dir: the directory to look in; ``None``: ``$NSQ_BIN_DIR`` when it is set
        (and not empty), else the directories of ``PATH``.
    :raises BinaryNotFoundError: when it is not there, or there but not executable.
    """
    if bin_dir is not None:
        return _in_directory(name, Path(bin_dir), f"bin_dir={os.fspath(bin_dir)!r}")
    from_environment = os.environ.get(BIN_DIR_VARIABLE, "")
    if from_environment:
        return _in_directory(name, Path(from_environment), f"${BIN_DIR_VARIABLE}")
    found = shutil.which(name)
    if found is None:
        searched = os.environ.get("PATH", os.defpath)
        raise BinaryNotFoundError(
            f"{name} not found on PATH ({searched}) and ${BIN_DIR_VARIABLE} is not set. "
            f"{_HOW_TO_GET}."
        )
    return os.path.abspath(found)


def _in_directory(name: str, directory: Path, chosen_by: str) -> str:
    path = directory / name
    if not path.is_file():
        raise BinaryNotFoundError(
            f"{name} not found in {directory} (from {chosen_by}). {_HOW_TO_GET}."
        )
    if not os.access(path, os.X_OK):
        raise BinaryNotFoundError(
            f"{path} (from {chosen_by}) is not executable (chmod +x it)."
        )
    # Absolute: the daemon runs in a directory of its own.
    return os.path.abspath(path)
