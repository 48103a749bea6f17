"""A mapping regex checked for its compiled size before the ``regex`` engine compiles it.

The ``regex`` engine unrolls counted repetition: ``(?:(?:a{999}){999}){999}`` is 33 characters
and compiles into about 10⁹ nodes (seconds of CPU and gigabytes before a MemoryError). Search time
is bounded elsewhere (every search carries a timeout); compile time cannot be, since the compiler
holds the GIL. So :func:`regex_cost` walks the pattern once, in linear time, without compiling it,
and estimates what it unrolls to: each atom counts 1, a group counts the sum of its parts, a counted
quantifier ``{m}``/``{m,n}``/``{m,}`` multiplies the atom before it by its largest bound (plus one
for an open upper bound). Nesting of groups is counted too. :func:`check_regex` refuses a pattern
past :data:`MAX_REGEX_UNROLLED` or :data:`MAX_REGEX_NESTING`; below them compiling takes
milliseconds.

The walk reads the syntax that changes the count (escapes, character classes with ``regex``'s
nested sets, groups, comments, counted quantifiers) and treats everything else as a plain atom,
so it over-estimates rather than under-estimates: a brace that is not a valid quantifier counts as
literal text, as both engines read it. Verbose mode ``(?x)`` is refused: its comments could hide a
parenthesis or a quantifier from the walk.
"""

from __future__ import annotations

import re

MAX_REGEX_CHARS = 1000
MAX_REGEX_UNROLLED = 20_000
MAX_REGEX_NESTING = 32
# An inline flag group that turns on verbose mode: (?x), (?ix), (?x:...), (?i-x:...) is matched too (refused
# conservatively: a comment there could hide a parenthesis or a quantifier from the walk).
_VERBOSE_FLAG = re.compile(r"\(\?[A-Za-z0-9-]*x[A-Za-z0-9-]*[:)]")
# Escapes whose argument sits in braces: \p{L}, \N{name}, \x{41}, \g<...> is angle-bracketed.
_BRACED_ESCAPES = frozenset("pPNxuUX")


def _skip_class(pattern: str, i: int) -> int:
    """Index just past the character class opening at ``pattern[i] == '['`` (nested sets allowed)."""
    depth, i = 1, i + 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":  # a leading ']' is a literal
        i += 1
    while i < len(pattern) and depth:
        ch = pattern[i]
        if ch == "\\":
            i += 1
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        i += 1
    return i


def _skip_escape(pattern: str, i: int) -> int:
    """Index just past the escape opening at ``pattern[i] == '\\'``."""
    if i + 2 < len(pattern) and pattern[i + 1] in _BRACED_ESCAPES and pattern[i + 2] == "{":
        end = pattern.find("}", i + 3)
        return len(pattern) if end < 0 else end + 1
    return i + 2


def _quantifier(pattern: str, i: int) -> tuple[int, int] | None:
    """``(factor, end)`` of a counted quantifier ``{m}``, ``{m,n}``, ``{,n}``, ``{m,}`` at ``i``, else None."""
    end = pattern.find("}", i + 1)
    if end < 0:
        return None
    low, sep, high = pattern[i + 1 : end].partition(",")
    low, high = low.strip(), high.strip()
    if not (low.isdigit() or (sep and high.isdigit())) or (low and not low.isdigit()) or (high and not high.isdigit()):
        return None
    bound = max(int(low or 0), int(high or 0)) + (1 if sep and not high else 0)
    return max(bound, 1), end + 1


def regex_cost(pattern: str) -> tuple[int, int]:
    """``(unrolled, nesting)``: the pattern's estimated node count once repetition is unrolled, its group depth."""
    frames: list[list[int]] = [[0, 0]]  # per open group: [total so far, last atom's count]
    deepest, i = 0, 0
    while i < len(pattern):
        ch, atom, nxt = pattern[i], 1, i + 1
        if ch == "\\":
            nxt = _skip_escape(pattern, i)
        elif ch == "[":
            nxt = _skip_class(pattern, i)
        elif ch == "(" and pattern.startswith("(?#", i):
            end = pattern.find(")", i)
            i = len(pattern) if end < 0 else end + 1
            continue
        elif ch == "(":
            frames.append([0, 0])
            deepest = max(deepest, len(frames) - 1)
            i += 1
            continue
        elif ch == ")" and len(frames) > 1:
            atom = max(frames.pop()[0], 1)
        elif ch == "{" and (quantifier := _quantifier(pattern, i)) is not None:
            factor, nxt = quantifier
            frame = frames[-1]
            frame[0] += frame[1] * (factor - 1)
            frame[1] *= factor
            i = nxt
            continue
        elif ch in "*+?|":
            atom = 0
        frames[-1][0] += atom
        frames[-1][1] = atom
        i = nxt
    while len(frames) > 1:  # an unclosed group: the engine refuses it; count it anyway
        total = frames.pop()[0]
        frames[-1][0] += total
    return frames[0][0], deepest


def check_regex(pattern: str) -> str | None:
    """Why ``pattern`` is refused before compiling (too long, too nested, unrolls too large), else None."""
    if len(pattern) > MAX_REGEX_CHARS:
        return f"regex longer than {MAX_REGEX_CHARS} characters"
    if _VERBOSE_FLAG.search(pattern):
        return "regex verbose mode (?x) is not supported in mappings"
    unrolled, nesting = regex_cost(pattern)
    if nesting > MAX_REGEX_NESTING:
        return f"regex groups nested {nesting} deep (at most {MAX_REGEX_NESTING})"
    if unrolled > MAX_REGEX_UNROLLED:
        return (
            f"regex counted repetition unrolls to about {unrolled} nodes (at most {MAX_REGEX_UNROLLED}); "
            "use * or + instead of large nested {m,n}"
        )
    return None
