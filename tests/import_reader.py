"""What a Python source imports, read with ``ast`` (never imported): the house-rule tests' reader.

Imports inside functions count (a deferred import still runs the moment it is called), and
relative imports are resolved against the module's package.
"""

from __future__ import annotations

import ast


def imported_names(source: str, package: str) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, anywhere in it, as dotted names:
    ``from a import b`` gives both ``a`` and ``a.b``."""
    names = set()
    parts = package.split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def is_under(name: str, prefixes: tuple[str, ...]) -> bool:
    """Whether dotted ``name`` is one of ``prefixes`` or inside one of them."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)
