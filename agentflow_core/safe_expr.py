"""A safe evaluator for reward-shaping conditions written in config files.

``eval`` with empty builtins is escapable (``().__class__.__bases__[0].__subclasses__()``,
``'{0.__class__}'.format(1)``, generator frames) and ``signal.alarm`` does not stop
``'a' * 10**10`` (docs/stack-notes.md "Safe expressions"). So a condition is parsed ONCE with
:func:`ast.parse`, checked against an allow-list, and compiled into a tree of closures over
plain floats; nothing the user wrote is ever handed to ``eval``/``exec``.

Grammar (everything else is rejected with :class:`UnsafeExpressionError`):

* names from the declared set (token names read as 1.0/0.0, feature names as floats);
  names starting with ``_`` are never allowed, even if declared;
* numeric and bool constants with ``|c| <= 1e9`` (no bytes, None, complex); a
  subexpression without names is evaluated once at compile time and rejected when undefined
  (``1e-300 ** -8``);
* string names (``strings=`` of :func:`compile_condition`: a scenario field such as ``network``) and
  string constants (at most 100 characters) only as the two operands of one unchained ``==`` or ``!=``
  (``network == "latency_500ms"``): a string name never enters arithmetic, a string constant nothing else;
* comparisons ``== != < <= > >=``, chained (``0 < cart_items <= 1``);
* ``and`` / ``or`` / ``not`` and unary ``+``/``-``;
* ``+ - * / %`` and ``**`` whose exponent is a numeric literal with ``|exp| <= 8``;
  at evaluation the base must satisfy ``|base| <= 1e9``;
* at most 200 AST nodes, nesting depth at most 32, source at most 1000 characters.

Semantics: every value is a Python float. Comparisons and ``and``/``or``/``not`` yield 1.0 or
0.0 (not Python's operand-returning ``and``/``or``) and short-circuit. A condition *holds*
when its value is non-zero.

Undefined arithmetic -- division or modulo by zero, a non-finite intermediate or result
(overflow, NaN/inf inputs), a fractional power of a negative base, a base beyond 1e9 -- is
handled in one documented way: :meth:`Condition.value` raises :class:`ExpressionEvalError`
naming the expression and the reason, while :meth:`Condition.__call__` (the form used for
shaping) treats the condition as **not holding** (False), so an undefined condition never
pays reward. A name missing from the values mapping is a programming error and always raises.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from agentflow_core.errors import AgentFlowError

MAX_CHARS = 1000
MAX_NODES = 200
MAX_DEPTH = 32
MAX_CONSTANT = 1e9
MAX_EXPONENT = 8.0
MAX_TEXT = 100  # characters of a string constant

Values = Mapping[str, float | str]  # a string name maps to a str (compared, never computed)
_Fn = Callable[[Values], float]


class UnsafeExpressionError(AgentFlowError):
    """The expression is outside the allowed grammar; raised at compile time."""

    def __init__(self, expr: object, reason: str) -> None:
        self.expr, self.reason = expr, reason
        shown = repr(expr) if len(repr(expr)) <= 120 else repr(expr)[:117] + "..."
        super().__init__(f"unsafe expression {shown}: {reason}")


class ExpressionEvalError(AgentFlowError):
    """Evaluation of a valid expression was undefined (division by zero, non-finite, ...)."""

    def __init__(self, expr: str, reason: str) -> None:
        self.expr, self.reason = expr, reason
        super().__init__(f"expression {expr!r}: {reason}")


class _Undefined(Exception):
    """Internal signal for undefined arithmetic; converted at the Condition boundary."""


def _finite(x: float) -> float:
    if not math.isfinite(x):
        raise _Undefined(f"non-finite intermediate value {x!r}")
    return x


def _div(a: float, b: float) -> float:
    if b == 0.0:
        raise _Undefined("division by zero")
    return _finite(a / b)


def _mod(a: float, b: float) -> float:
    if b == 0.0:
        raise _Undefined("modulo by zero")
    return _finite(a % b)


_ARITH: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _div,
    ast.Mod: _mod,
}
_COMPARE: dict[type[ast.cmpop], Callable[[float, float], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def _and(left: _Fn, right: _Fn) -> _Fn:
    return lambda v: 1.0 if left(v) and right(v) else 0.0


def _or(left: _Fn, right: _Fn) -> _Fn:
    return lambda v: 1.0 if left(v) or right(v) else 0.0


@dataclass(frozen=True)
class Condition:
    """A compiled, validated condition; evaluation costs a few microseconds."""

    expr: str
    names: frozenset[str]
    _fn: _Fn

    def value(self, values: Values) -> float:
        """The numeric value; raises :class:`ExpressionEvalError` when undefined."""
        try:
            return _finite(self._fn(values))
        except _Undefined as exc:
            raise ExpressionEvalError(self.expr, str(exc)) from None
        except KeyError as exc:
            raise ExpressionEvalError(self.expr, f"no value provided for name {exc.args[0]!r}") from None

    def __call__(self, values: Values) -> bool:
        """Whether the condition holds; undefined arithmetic counts as not holding."""
        try:
            return _finite(self._fn(values)) != 0.0
        except _Undefined:
            return False
        except KeyError as exc:
            raise ExpressionEvalError(self.expr, f"no value provided for name {exc.args[0]!r}") from None


def compile_condition(expr: str, names: Collection[str], strings: Collection[str] = ()) -> Condition:
    """Parse and validate ``expr`` once against the allow-list, return a fast :class:`Condition`.

    ``names`` read as numbers; ``strings`` name string values, usable only as ``name == "text"`` / ``!=``.
    """
    if not isinstance(expr, str):
        raise UnsafeExpressionError(expr, f"expected a string, got {type(expr).__name__}")
    if len(expr) > MAX_CHARS:
        raise UnsafeExpressionError(expr, f"longer than {MAX_CHARS} characters ({len(expr)})")
    if not expr.strip():
        raise UnsafeExpressionError(expr, "empty expression")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise UnsafeExpressionError(expr, f"syntax error: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise UnsafeExpressionError(expr, f"cannot be parsed safely: {type(exc).__name__}") from None
    compiler = _Compiler(expr, frozenset(names) | frozenset(strings), frozenset(strings))
    fn = compiler.compile(tree.body, depth=1)
    return Condition(expr=expr, names=frozenset(compiler.used), _fn=fn)


class _Compiler:
    """Recursive allow-list validator that emits closures; depth is capped before recursing."""

    def __init__(self, expr: str, names: frozenset[str], strings: frozenset[str] = frozenset()) -> None:
        self.expr, self.allowed, self.nodes, self.name_refs = expr, names, 0, 0
        self.strings = strings
        self.used: set[str] = set()

    def reject(self, reason: str) -> UnsafeExpressionError:
        return UnsafeExpressionError(self.expr, reason)

    def compile(self, node: ast.expr, depth: int) -> _Fn:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.reject(f"more than {MAX_NODES} syntax nodes")
        if depth > MAX_DEPTH:
            raise self.reject(f"nested deeper than {MAX_DEPTH}")
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is None:
            raise self.reject(f"{_describe(node)} is not allowed")
        refs_before = self.name_refs
        fn: _Fn = handler(node, depth + 1)
        if self.name_refs == refs_before and not isinstance(node, ast.Constant):
            return self._fold(fn)
        return fn

    def _fold(self, fn: _Fn) -> _Fn:
        """Evaluate a name-free subexpression now: ``1e-300 ** -8`` fails validation, not a training run."""
        try:
            c = _finite(fn({}))
        except _Undefined as exc:
            raise self.reject(f"undefined for constant operands: {exc}") from None
        return lambda _v: c

    def _Constant(self, node: ast.Constant, depth: int) -> _Fn:
        value = node.value
        if isinstance(value, bool):
            c = 1.0 if value else 0.0
        elif isinstance(value, int) and abs(value) > MAX_CONSTANT:  # before float(): 999 digits overflow it
            raise self.reject(
                f"constant with {len(str(abs(value)))} digits outside [-{MAX_CONSTANT:g}, {MAX_CONSTANT:g}]"
            )
        elif isinstance(value, int | float):
            if not math.isfinite(value) or abs(value) > MAX_CONSTANT:
                raise self.reject(f"constant {value!r} outside [-{MAX_CONSTANT:g}, {MAX_CONSTANT:g}]")
            c = float(value)
        elif isinstance(value, str):
            raise self.reject('str constants are not allowed (but in `string_name == "text"` or !=)')
        else:
            raise self.reject(f"{type(value).__name__} constants are not allowed (only numbers and booleans)")
        return lambda _v: c

    def _checked_name(self, name: str) -> str:
        if name.startswith("_"):
            raise self.reject(f"name {name!r} is not allowed (underscore/dunder names are forbidden)")
        if name not in self.allowed:
            raise self.reject(f"unknown name {name!r}; allowed names are declared tokens and features")
        self.used.add(name)
        self.name_refs += 1
        return name

    def _Name(self, node: ast.Name, depth: int) -> _Fn:
        name = self._checked_name(node.id)
        if name in self.strings:
            raise self.reject(f'string name {name!r} is allowed only in `{name} == "text"` (or !=)')

        def lookup(v: Values) -> float:
            return _finite(float(v[name]))

        return lookup

    def _UnaryOp(self, node: ast.UnaryOp, depth: int) -> _Fn:
        operand = self.compile(node.operand, depth)
        if isinstance(node.op, ast.Not):
            return lambda v: 0.0 if operand(v) else 1.0
        if isinstance(node.op, ast.USub):
            return lambda v: -operand(v)
        if isinstance(node.op, ast.UAdd):
            return operand
        raise self.reject(f"unary operator {type(node.op).__name__} is not allowed")

    def _BoolOp(self, node: ast.BoolOp, depth: int) -> _Fn:
        # A left fold of two-operand closures: cheaper per call than all()/any() over a generator.
        parts = [self.compile(n, depth) for n in node.values]
        fn = parts[0]
        for right in parts[1:]:
            fn = _and(fn, right) if isinstance(node.op, ast.And) else _or(fn, right)
        return fn

    def _BinOp(self, node: ast.BinOp, depth: int) -> _Fn:
        if isinstance(node.op, ast.Pow):
            return self._power(node, depth)
        op = _ARITH.get(type(node.op))
        if op is None:
            raise self.reject(f"binary operator {type(node.op).__name__} is not allowed")
        left, right = self.compile(node.left, depth), self.compile(node.right, depth)
        return lambda v: _finite(op(left(v), right(v)))

    def _power(self, node: ast.BinOp, depth: int) -> _Fn:
        exponent = _literal_number(node.right)
        if exponent is None:
            raise self.reject("the exponent of ** must be a numeric literal")
        if abs(exponent) > MAX_EXPONENT:
            raise self.reject(f"exponent {exponent:g} exceeds {MAX_EXPONENT:g}")
        self.nodes += 1
        base = self.compile(node.left, depth)
        integral = float(exponent).is_integer()

        def power(v: Values) -> float:
            b = base(v)
            if abs(b) > MAX_CONSTANT:
                raise _Undefined(f"base {b:g} of ** exceeds {MAX_CONSTANT:g}")
            if b < 0.0 and not integral:
                raise _Undefined("fractional power of a negative base")
            if b == 0.0 and exponent < 0:
                raise _Undefined("zero to a negative power")
            try:
                return _finite(b**exponent)
            except OverflowError:  # float ** raises instead of returning inf (1e-300 ** -8)
                raise _Undefined(f"{b:g} ** {exponent:g} overflows") from None

        return power

    def _Compare(self, node: ast.Compare, depth: int) -> _Fn:
        sides = (node.left, *node.comparators)
        if self.strings and any(_is_text(n) or (isinstance(n, ast.Name) and n.id in self.strings) for n in sides):
            return self._string_compare(node)
        ops = []
        for op in node.ops:
            fn = _COMPARE.get(type(op))
            if fn is None:
                raise self.reject(f"comparison {type(op).__name__} is not allowed")
            ops.append(fn)
        operands = tuple(self.compile(n, depth) for n in (node.left, *node.comparators))
        pairs = tuple(zip(ops, operands[1:], strict=True))
        first = operands[0]

        def compare(v: Values) -> float:
            left = first(v)
            for op, right_fn in pairs:
                right = right_fn(v)
                if not op(left, right):
                    return 0.0
                left = right
            return 1.0

        return compare

    def _string_compare(self, node: ast.Compare) -> _Fn:
        """``name == "text"`` or ``!=`` (either side): the only place a string name or constant may appear."""
        shape = 'a string comparison must be `string_name == "text"` or `!=`, unchained'
        if len(node.ops) != 1 or not isinstance(node.ops[0], ast.Eq | ast.NotEq):
            raise self.reject(shape)
        left, right = node.left, node.comparators[0]
        name_node, text_node = (left, right) if isinstance(left, ast.Name) else (right, left)
        if not isinstance(name_node, ast.Name) or name_node.id not in self.strings or not _is_text(text_node):
            raise self.reject(shape)
        assert isinstance(text_node, ast.Constant)
        self.nodes += 2
        name, text = self._checked_name(name_node.id), str(text_node.value)
        if len(text) > MAX_TEXT:
            raise self.reject(f"string constant longer than {MAX_TEXT} characters")
        if isinstance(node.ops[0], ast.Eq):
            return lambda v: 1.0 if v[name] == text else 0.0
        return lambda v: 0.0 if v[name] == text else 1.0


def _is_text(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _literal_number(node: ast.expr) -> float | None:
    """A numeric literal, optionally negated; booleans and anything else give None."""
    sign = 1.0
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        sign = -1.0 if isinstance(node.op, ast.USub) else 1.0
        node = node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        if isinstance(node.value, int) and abs(node.value) > MAX_CONSTANT:
            return sign * math.inf  # rejected by the exponent bound, without float() of a huge int
        return sign * float(node.value) if math.isfinite(node.value) else None
    return None


_DESCRIPTIONS = {
    "Call": "a function call",
    "Attribute": "attribute access",
    "Subscript": "subscripting",
    "Lambda": "lambda",
    "JoinedStr": "an f-string",
    "FormattedValue": "an f-string",
    "ListComp": "a comprehension",
    "SetComp": "a comprehension",
    "DictComp": "a comprehension",
    "GeneratorExp": "a generator expression",
    "NamedExpr": "the walrus operator (:=)",
    "Starred": "starred unpacking",
    "IfExp": "a conditional expression",
    "Await": "await",
    "Yield": "yield",
    "YieldFrom": "yield",
}


def _describe(node: ast.AST) -> str:
    kind = type(node).__name__
    return _DESCRIPTIONS.get(kind, f"syntax {kind}")
