"""The documentation as tests read it: README.md and the docs site's pages (docs/), and
what the architecture and configuration pages must name (the modules of ``proxy/``, the
keys of the settings schema)."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """One page of the docs site, ``name`` relative to docs/ (``"kubernetes.md"``)."""
    return (DOCS / name).read_text(encoding="utf-8")


def all_docs() -> str:
    """README.md and every page under docs/, one text: what "the docs say" means to a test
    that does not care on which page a sentence lives."""
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return "\n\n".join(p.read_text(encoding="utf-8") for p in pages)


def modules() -> list[str]:
    """Every module of ``proxy/`` the architecture page lists: all but the simulator's and
    the packages' ``__init__.py`` that hold no code of their own, as ``proxy/core/plan.py``."""
    found = []
    for path in sorted((ROOT / "proxy").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        bare = path.name == "__init__.py" and not re.search(
            r"^(async def|def|class) ", path.read_text(), re.M
        )
        if not bare and not relative.startswith("proxy/simulator/"):
            found.append(relative)
    return found


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds: itself, a list's items, a union's arms."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def config_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key of the settings schema ``model``, walked recursively: ``server.port``, and
    for a list of sections ``models[].match``. A section is a key itself only when it holds
    no keys (none does today)."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        inner = _models_in(field.annotation)
        if not inner:
            keys.append(prefix + name)
            continue
        listed = typing.get_origin(field.annotation) is list
        for sub in inner:
            keys.extend(config_keys(sub, f"{prefix}{name}{'[]' if listed else ''}."))
    return list(dict.fromkeys(keys))
