"""txnsq's public surface as text, read by griffe from the source (nothing is imported).

``tests/public_api.txt`` holds it; ``tests/unit/test_public_api.py`` fails when the code's
surface differs, showing the difference, so a change to a public name or signature is
always a deliberate, reviewed diff. After such a change (with its deprecation and
changelog entry), write the file again::

    python -m tests.support.public_api --write

What is public: every module of the ``txnsq`` package whose dotted path has no part
starting with an underscore, and in each, the names its ``__all__`` lists (or, without
``__all__``, the names it defines that do not start with an underscore); for a class,
its bases and its public methods, properties and attributes (dataclass fields with their
types and defaults; the old names inherited from :mod:`txnsq._api.compat` too); for a
function or method, its whole signature.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "public_api.txt"

#: Dunder methods that are part of the surface (the others are implementation).
_PUBLIC_DUNDERS = frozenset(
    {"__init__", "__call__", "__enter__", "__exit__", "__iter__", "__len__", "__getitem__"}
)


def _signature(function: griffe.Function) -> str:
    parts: list[str] = []
    seen_star = False
    for p in function.parameters:
        kind = p.kind
        if kind is griffe.ParameterKind.var_positional:
            seen_star = True
            text = f"*{p.name}"
        elif kind is griffe.ParameterKind.var_keyword:
            text = f"**{p.name}"
        else:
            if kind is griffe.ParameterKind.keyword_only and not seen_star:
                parts.append("*")
                seen_star = True
            text = p.name
        if p.annotation is not None and p.name != "self":  # a mixin's protocol, for mypy
            text += f": {p.annotation}"
        if p.default is not None:
            text += f" = {p.default}"
        parts.append(text)
        if kind is griffe.ParameterKind.positional_only and (
            p is function.parameters[-1]
            or function.parameters[list(function.parameters).index(p) + 1].kind
            is not griffe.ParameterKind.positional_only
        ):
            parts.append("/")
    returns = f" -> {function.returns}" if function.returns is not None else ""
    return f"({', '.join(parts)}){returns}"


def _is_public(name: str) -> bool:
    return not name.startswith("_") or name in _PUBLIC_DUNDERS


#: Where the classes holding old names are (see :mod:`txnsq._api.compat`).
_COMPAT = "txnsq._api.compat."


def _describe(obj: griffe.Object | griffe.Alias, path: str) -> Iterator[str]:
    target = obj.final_target if isinstance(obj, griffe.Alias) else obj
    if isinstance(target, griffe.Class):
        bases = ", ".join(str(b) for b in target.bases)
        yield f"class {path}({bases})"
        members = dict(target.members)
        # The old names a class keeps until their removal live in txnsq._api.compat, in
        # a class it inherits from: part of its surface all the same.
        for name, member in target.inherited_members.items():
            if name not in members and member.target_path.startswith(_COMPAT):
                members[name] = member
        for name in sorted(members):
            if not _is_public(name):
                continue
            yield from _member(members[name], f"{path}.{name}")
    elif isinstance(target, griffe.Function):
        yield f"def {path}{_signature(target)}"
    elif isinstance(target, griffe.Attribute):
        annotation = f": {target.annotation}" if target.annotation is not None else ""
        yield f"{path}{annotation}"
    elif isinstance(target, griffe.Module):
        yield f"module {path} (as {target.path})"


def _member(member: griffe.Object | griffe.Alias, path: str) -> Iterator[str]:
    if isinstance(member, griffe.Alias):
        try:
            member = member.final_target
        except griffe.AliasResolutionError:
            yield f"{path} (alias of {member.target_path})"
            return
    if isinstance(member, griffe.Function):
        labels = sorted(member.labels & {"property", "classmethod", "staticmethod"})
        prefix = f"@{labels[0]} " if labels else ""
        yield f"  {prefix}def {path}{_signature(member)}"
    elif isinstance(member, griffe.Attribute):
        annotation = f": {member.annotation}" if member.annotation is not None else ""
        default = ""
        if "class-attribute" in member.labels and member.value is not None:
            default = f" = {member.value}"
        yield f"  {path}{annotation}{default}"
    elif isinstance(member, griffe.Class):
        yield f"  class {path}"


def _public_modules(package: griffe.Module) -> Iterator[griffe.Module]:
    yield package
    for name in sorted(package.modules):
        module = package.modules[name]
        # A module imported under a public name (``from txnsq._wire import commands``) is
        # not a submodule: its names are the other module's, not this package's.
        if name.startswith("_") or module.is_alias:
            continue
        yield from _public_modules(module)


def surface(root: Path = ROOT) -> list[str]:
    """Every public name of txnsq with its signature, one line each, in a stable order."""
    loader = griffe.GriffeLoader(search_paths=[str(root)])
    package = loader.load("txnsq")
    loader.resolve_aliases(implicit=True, external=False)
    lines: list[str] = []
    for module in _public_modules(package):  # type: ignore[arg-type]
        exported = module.exports
        if exported is not None:
            names = sorted(str(n) for n in exported)
        else:
            names = sorted(
                n
                for n, m in module.members.items()
                if not n.startswith("_") and not m.is_alias and not m.is_module
            )
        lines.append(f"[{module.path}]")
        for name in names:
            member = module.members.get(name)
            if member is None:
                lines.append(f"{module.path}.{name} (listed in __all__, not found)")
                continue
            try:
                lines.extend(_describe(member, f"{module.path}.{name}"))
            except griffe.AliasResolutionError:
                lines.append(f"{module.path}.{name} (alias of {member.target_path})")
    return lines


def main(argv: list[str]) -> int:
    text = "\n".join(surface()) + "\n"
    if argv[1:] == ["--write"]:
        SNAPSHOT.write_text(text)
        print(f"wrote {SNAPSHOT.relative_to(ROOT)} ({text.count(chr(10))} lines)")
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
