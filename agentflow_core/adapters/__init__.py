"""Semantic adapter templates, looked up by template name.

The lookup imports lazily so that naming a template costs nothing until an env is built, and a
registry of three families does not import the SQL or HTTP stacks of channels it never makes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentflow_core.adapters.base import BaseSemanticAdapter

# Template name (the mapping file's ``template``) -> "module:Class" of its adapter.
ADAPTER_CLASS_PATHS: dict[str, str] = {
    "web": "agentflow_core.adapters.web:WebAdapter",
    "db": "agentflow_core.adapters.db:DBAdapter",
    "api": "agentflow_core.adapters.api:APISchemaAdapter",
}


def load_object(path: str) -> Any:
    """Import ``"package.module:Attr"``; a missing module or attribute raises ImportError naming the path."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ImportError(f"{path!r} is not of the form 'package.module:Attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot import module {module_name!r} of {path!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImportError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def adapter_class(name: str) -> type[BaseSemanticAdapter]:
    """The adapter class of a template name (web | db | api) or of an explicit ``"module:Class"``.

    An explicit path is the extension point for a new channel template without editing this table.
    """
    from agentflow_core.adapters.base import BaseSemanticAdapter

    path = ADAPTER_CLASS_PATHS.get(name, name if ":" in name else None)
    if path is None:
        raise KeyError(f"unknown adapter {name!r}, expected one of {sorted(ADAPTER_CLASS_PATHS)} or 'module:Class'")
    cls = load_object(path)
    if not (isinstance(cls, type) and issubclass(cls, BaseSemanticAdapter)):
        raise TypeError(f"{path!r} is not a BaseSemanticAdapter subclass")
    return cls
