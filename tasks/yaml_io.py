"""The one YAML reader of the project: PyYAML's safe loader with limits, so a config file cannot bomb it.

PyYAML's ``safe_load`` expands aliases without limit (a 324-byte "billion laughs" file cost 3
minutes and 6.8 GB), recurses once per nesting level (5,000 levels end in RecursionError), lets a
later duplicate key replace an earlier one silently and hands 5,000-digit integers to ``int()``
(docs/stack-notes.md "YAML"). This loader refuses all of these before building anything large:

* the file is at most ``MAX_BYTES`` and strict UTF-8 text (no NUL bytes, no UTF-16);
* at most ``MAX_ALIASES`` aliases, nesting at most ``MAX_DEPTH`` deep, at most ``MAX_NODES``
  nodes once aliases are expanded (counted on the composed graph, never materialised);
* a duplicate key in any mapping is an error naming the key and its line;
* integers have at most ``MAX_INT_DIGITS`` digits.

Every problem is one :class:`YamlLimitError` with a ``where`` (line/column or key) and a reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_BYTES = 1 << 20
MAX_ALIASES = 64
MAX_DEPTH = 64
MAX_NODES = 100_000
MAX_INT_DIGITS = 64


class YamlLimitError(ValueError):
    """A YAML document that is malformed or outside the loader's limits."""

    def __init__(self, where: str, reason: str) -> None:
        self.where, self.reason = where, reason
        super().__init__(f"{where}: {reason}")


def _at(node: Node | None) -> str:
    mark = getattr(node, "start_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "<file>"


class _LimitedLoader(yaml.SafeLoader):
    """SafeLoader whose composer counts aliases and depth and whose constructor refuses duplicates."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlLimitError(_at(self.peek_event()), f"more than {MAX_ALIASES} aliases")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlLimitError(_at(self.peek_event()), f"nested deeper than {MAX_DEPTH} levels")
            return Composer.compose_node(self, parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, MappingNode):  # ``!!set x``: PyYAML's own check raises its ConstructorError
            return SafeConstructor.construct_mapping(self, node, deep=deep)
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                if key in seen:
                    raise YamlLimitError(f"{_at(key_node)}, key {str(key)[:80]!r}", "duplicate key")
                seen.add(key)
        return SafeConstructor.construct_mapping(self, node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise YamlLimitError(_at(node), f"integer with {digits} digits (at most {MAX_INT_DIGITS})")
        return SafeConstructor.construct_yaml_int(self, node)


_LimitedLoader.add_constructor("tag:yaml.org,2002:int", _LimitedLoader.construct_yaml_int)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _expanded_size(root: Node) -> int:
    """Nodes the document would have with every alias expanded, memoised by node identity (no expansion).

    A depth-first walk with the nodes of the current path kept aside: an alias that points at one of
    them (``x: &a [*a]``, a recursive structure) is a cycle, refused at once. Without that check a
    cycle kept the walk pushing the same node forever (100% CPU, memory growing).
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = {id(root)}
    stack: list[tuple[Node, list[Node]]] = [(root, _children(root))]
    while stack:
        node, pending = stack[-1]
        if pending:
            child = pending.pop()
            if id(child) in on_path:
                raise YamlLimitError(_at(child), "recursive alias (the anchor defined here is used inside itself)")
            if id(child) not in sizes:
                on_path.add(id(child))
                stack.append((child, _children(child)))
            continue
        stack.pop()
        on_path.discard(id(node))
        sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in _children(node)), MAX_NODES + 1)
    return sizes[id(root)]


def load_yaml_text(text: str) -> Any:
    """Parse one YAML document within the limits; any problem raises :class:`YamlLimitError`."""
    if len(text) > MAX_BYTES:
        raise YamlLimitError("<file>", f"larger than {MAX_BYTES} bytes ({len(text)})")
    if "\x00" in text:
        raise YamlLimitError("<file>", "contains NUL characters (a binary or UTF-16 file, not YAML text)")
    loader: _LimitedLoader | None = None
    try:
        loader = _LimitedLoader(text)  # its reader already refuses control characters
        root = loader.get_single_node()
        if root is None:
            return None
        size = _expanded_size(root)
        if size > MAX_NODES:
            raise YamlLimitError(_at(root), f"more than {MAX_NODES} nodes once aliases are expanded")
        return loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "<file>"
        raise YamlLimitError(where, f"malformed YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise YamlLimitError("<file>", f"malformed YAML: {exc}") from None
    except YamlLimitError:
        raise
    except (RecursionError, MemoryError, OverflowError) as exc:
        raise YamlLimitError("<file>", f"cannot be parsed within limits ({type(exc).__name__})") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:  # a constructor PyYAML did not guard
        raise YamlLimitError("<file>", f"malformed YAML: {type(exc).__name__}: {str(exc)[:200]}") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_text_file(path: Path) -> str:
    """A config file's text: at most ``MAX_BYTES``, strict UTF-8, else :class:`YamlLimitError`."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlLimitError("<file>", f"larger than {MAX_BYTES} bytes")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data:
        raise YamlLimitError("<file>", "binary or UTF-16 content; expected UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlLimitError("<file>", f"not UTF-8 text (byte {exc.start})") from None


def load_yaml_file(path: Path) -> Any:
    """:func:`read_text_file` then :func:`load_yaml_text`."""
    return load_yaml_text(read_text_file(path))
