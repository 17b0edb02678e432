"""The release's own files, checked on the source (the built artefacts themselves are
checked by ``scripts/check-dist``, a step of ``scripts/test``).

- ``python -m txnsq`` (:mod:`txnsq.__main__`): ``--version`` prints ``txnsq <version>``,
  no argument prints the version, the documentation's address and the twistd command,
  and neither imports Twisted.
- The metadata: an SPDX licence expression with ``LICENSE`` as the licence file, no
  licence classifier (setuptools warns on those), the project URLs, the author.
- ``scripts/floors.txt`` pins exactly the lower bounds that setup.cfg declares, so the
  floors run of ``scripts/test`` tests what we promise.
- The changelog: every news fragment's name is one towncrier reads as we mean it,
  ``towncrier build --draft`` renders them into valid reStructuredText, and the newest
  section of CHANGELOG.rst is this version's.
"""

from __future__ import annotations

import configparser
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import docutils.core
import docutils.utils
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from twisted.trial.unittest import SynchronousTestCase

from tests.support.env import REPO
from txnsq import __main__ as cli
from txnsq._version import __version__

#: setup.cfg's sections whose requirements are declared floors that the floors run
#: installs (the test and bench tools are used at their current versions).
FLOOR_SECTIONS = ("install_requires", "metrics", "spark")

#: The fragment types of pyproject.toml's [tool.towncrier].
FRAGMENT_TYPES = ("feature", "bugfix", "deprecation", "removal", "doc", "misc")

#: ``<issue>.<type>.rst``, ``<issue>.<type>.<n>.rst`` or ``+<word>.<type>.rst``.
FRAGMENT_NAME = re.compile(
    rf"^(?:[1-9][0-9]*|\+[a-z0-9][a-z0-9-]*)\.(?:{'|'.join(FRAGMENT_TYPES)})(?:\.[1-9][0-9]*)?\.rst$"
)


def setup_cfg() -> configparser.ConfigParser:
    """setup.cfg, parsed."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "setup.cfg", encoding="utf-8")
    return config


def lines_of(value: str) -> list[str]:
    """The non-empty lines of a multi-line setup.cfg value."""
    return [line.strip() for line in value.splitlines() if line.strip()]


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    """Run this Python on ``args`` in the repository, with the checkout importable."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class MainTests(SynchronousTestCase):
    """``python -m txnsq``."""

    def run_main(self, *argv: str) -> str:
        out = io.StringIO()
        self.assertEqual(cli.main(list(argv), out=out), 0)
        return out.getvalue()

    def test_version(self) -> None:
        self.assertEqual(self.run_main("--version"), f"txnsq {__version__}\n")

    def test_version_is_a_release(self) -> None:
        """The version is a plain release number, as the changelog and PyPI name it."""
        self.assertEqual(str(Version(__version__)), __version__)
        self.assertFalse(Version(__version__).is_prerelease)

    def test_usage(self) -> None:
        text = self.run_main()
        self.assertEqual(text, cli.usage())
        self.assertTrue(text.startswith(f"txnsq {__version__}:"), text)
        self.assertIn(cli.DOCUMENTATION, text)
        self.assertIn("twistd nsq-consumer --help", text)
        self.assertIn("python -m txnsq --version", text)

    def test_unknown_argument(self) -> None:
        stderr = io.StringIO()
        self.patch(sys, "stderr", stderr)
        with self.assertRaises(SystemExit) as caught:
            cli.main(["--verison"], out=io.StringIO())
        self.assertEqual(caught.exception.code, 2)
        self.assertIn("unrecognized arguments: --verison", stderr.getvalue())

    def test_as_a_module(self) -> None:
        """``python -m txnsq --version`` in a process of its own."""
        done = run_python("-m", "txnsq", "--version")
        self.assertEqual(
            (done.returncode, done.stdout, done.stderr), (0, f"txnsq {__version__}\n", "")
        )

    def test_imports_no_twisted(self) -> None:
        done = run_python(
            "-c",
            "import sys\n"
            "from txnsq.__main__ import main\n"
            "main([])\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'twisted'], 'twisted'\n",
        )
        self.assertEqual(done.returncode, 0, done.stderr)

    def test_documentation_address_is_the_metadata(self) -> None:
        """The address it prints is setup.cfg's Documentation project URL."""
        urls = dict(
            (part.strip() for part in line.split("=", 1))
            for line in lines_of(setup_cfg()["metadata"]["project_urls"])
        )
        self.assertEqual(urls["Documentation"], cli.DOCUMENTATION)


class MetadataTests(SynchronousTestCase):
    """What setup.cfg, LICENSE and MANIFEST.in declare."""

    def test_license(self) -> None:
        metadata = setup_cfg()["metadata"]
        self.assertEqual(metadata["license_expression"], "MIT")
        self.assertEqual(lines_of(metadata["license_files"]), ["LICENSE"])
        self.assertNotIn("license", metadata)
        classifiers = lines_of(metadata["classifiers"])
        self.assertEqual([c for c in classifiers if c.startswith("License ::")], [])
        text = (REPO / "LICENSE").read_text(encoding="utf-8")
        self.assertTrue(text.startswith("MIT License\n"), text[:40])
        self.assertIn("Copyright (c) 2026 the txnsq developers\n", text)

    def test_project(self) -> None:
        metadata = setup_cfg()["metadata"]
        self.assertEqual(metadata["author"], "the txnsq developers")
        names = [line.split("=", 1)[0].strip() for line in lines_of(metadata["project_urls"])]
        self.assertEqual(names, ["Homepage", "Documentation", "Source", "Changelog", "Issues"])

    def test_every_package_is_in_the_wheel(self) -> None:
        """setup.cfg lists its packages by hand: a package left out is missing from the
        wheel, and only an installed wheel would show it."""
        listed = set(setup_cfg()["options"]["packages"].split())
        found = {
            ".".join(init.parent.relative_to(REPO).parts)
            for init in (REPO / "txnsq").rglob("__init__.py")
        }
        self.assertEqual(found - listed, set())
        self.assertEqual(listed - found - {"twisted.plugins"}, set())

    def test_sdist_without_tests(self) -> None:
        """The sdist carries no test (scripts/check-dist checks the built one)."""
        manifest = lines_of((REPO / "MANIFEST.in").read_text(encoding="utf-8"))
        self.assertIn("prune tests", manifest)
        self.assertIn("include LICENSE README.rst CHANGELOG.rst", manifest)

    def test_check_dist_parses(self) -> None:
        done = subprocess.run(
            ["bash", "-n", str(REPO / "scripts" / "check-dist")],
            capture_output=True,
            text=True,
            check=False,
        )
        self.assertEqual(done.returncode, 0, done.stderr)


def declared_floors() -> dict[str, Version]:
    """The ``>=`` bound of each requirement in setup.cfg's FLOOR_SECTIONS, by name."""
    config = setup_cfg()
    requirements = lines_of(config["options"]["install_requires"])
    for extra in FLOOR_SECTIONS[1:]:
        requirements += lines_of(config["options.extras_require"][extra])
    floors: dict[str, Version] = {}
    for line in requirements:
        requirement = Requirement(line)
        bounds = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        if len(bounds) != 1:
            raise AssertionError(f"{line!r} in setup.cfg has no single '>=' bound to test")
        floors[canonicalize_name(requirement.name)] = bounds[0]
    return floors


def pinned_floors(text: str) -> dict[str, Version]:
    """The ``name==version`` lines of a constraints file, by name."""
    pins: dict[str, Version] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        if specifier.operator != "==" or requirement.extras:
            raise AssertionError(f"{line!r}: a floors line is name==version")
        pins[canonicalize_name(requirement.name)] = Version(specifier.version)
    return pins


class FloorsTests(SynchronousTestCase):
    """scripts/floors.txt against setup.cfg."""

    def test_floors_match_setup_cfg(self) -> None:
        declared = declared_floors()
        pinned = pinned_floors((REPO / "scripts" / "floors.txt").read_text(encoding="utf-8"))
        want = "\n".join(f"{name}=={version}" for name, version in declared.items())
        self.assertEqual(pinned, declared, f"scripts/floors.txt should pin:\n{want}")

    def test_pins_are_exact_releases(self) -> None:
        """Each pin names a full release (``26.4.0``, not ``26.4``), as pip shows it."""
        text = (REPO / "scripts" / "floors.txt").read_text(encoding="utf-8")
        for name, version in pinned_floors(text).items():
            self.assertEqual(len(version.release), 3, f"{name}=={version}")

    def test_parsers(self) -> None:
        self.assertEqual(
            pinned_floors("# c\ntwisted==26.4.0  # why\n\nTreq==24.9.0\n"),
            {"twisted": Version("26.4"), "treq": Version("24.9")},
        )
        with self.assertRaises(AssertionError):
            pinned_floors("twisted>=26.4\n")
        with self.assertRaises(AssertionError):
            pinned_floors("twisted[tls]==26.4.0\n")


def fragments() -> list[Path]:
    """The news fragments (every file of newsfragments/ but its README)."""
    return sorted(p for p in (REPO / "newsfragments").iterdir() if p.name != "README.rst")


def rst_problems(text: str) -> list[str]:
    """docutils' warnings and errors on ``text`` as reStructuredText."""
    stream = io.StringIO()
    docutils.core.publish_doctree(
        text,
        settings_overrides={"warning_stream": stream, "report_level": 2, "halt_level": 5},
    )
    return [line for line in stream.getvalue().splitlines() if line.strip()]


class ChangelogTests(SynchronousTestCase):
    """newsfragments/, towncrier and CHANGELOG.rst."""

    def test_fragment_names(self) -> None:
        bad = [p.name for p in fragments() if not FRAGMENT_NAME.match(p.name) or p.is_dir()]
        self.assertEqual(
            bad, [], "name fragments <issue>.<type>[.<n>].rst, see newsfragments/README.rst"
        )

    def test_fragment_name_pattern(self) -> None:
        for good in ("20.feature.rst", "20.deprecation.3.rst", "+pypi.misc.rst"):
            self.assertTrue(FRAGMENT_NAME.match(good), good)
        for bad in (
            "20.feature",
            "20.features.rst",
            "20.feature.rst.rst",
            "feature.rst",
            "020.bugfix.rst",
            "20.misc.0.rst",
            "20.misc.a.rst",
            "+.misc.rst",
            "20.doc.md",
        ):
            self.assertIsNone(FRAGMENT_NAME.match(bad), bad)

    def test_types_are_towncrier_config(self) -> None:
        """The pattern's types are the ones pyproject.toml configures."""
        import tomllib

        config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
        types = [t["directory"] for t in config["tool"]["towncrier"]["type"]]
        self.assertEqual(sorted(types), sorted(FRAGMENT_TYPES))

    def test_draft(self) -> None:
        """``towncrier build --draft`` renders every fragment into valid reST."""
        done = run_python("-m", "towncrier", "build", "--draft", "--version", "9.9.9")
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        draft = done.stdout  # towncrier's own messages go to standard error
        self.assertTrue(draft.startswith("txnsq 9.9.9 ("), draft)
        rendered = " ".join(draft.split())
        for fragment in fragments():
            text = " ".join(fragment.read_text(encoding="utf-8").split())
            self.assertIn(text, rendered, fragment.name)
        self.assertEqual(rst_problems(draft), [])

    def test_changelog(self) -> None:
        text = (REPO / "CHANGELOG.rst").read_text(encoding="utf-8")
        self.assertIn("\n.. towncrier release notes start\n", text)
        self.assertEqual(rst_problems(text), [])

    def test_changelog_names_this_version(self) -> None:
        """The newest section is the version txnsq says it is: a release bumps
        ``txnsq/_version.py`` and runs ``towncrier build`` together."""
        text = (REPO / "CHANGELOG.rst").read_text(encoding="utf-8")
        _, _, releases = text.partition("\n.. towncrier release notes start\n")
        newest = releases.strip().splitlines()[0]
        self.assertTrue(newest.startswith(f"txnsq {__version__} ("), newest)
