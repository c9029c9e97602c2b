"""Java's regular expressions, as Spark evaluates them, in Python's ``re``.

Spark's ``rlike``, ``regexp_extract``, ``regexp_replace`` and ``split`` take Java
patterns and run Java's ``Matcher``. :func:`translate` gives the Python pattern of the
same meaning for the constructs both engines read alike, and refuses the others
(:class:`NotTranslated`, naming the construct); :func:`find_all` is Java's ``find``
loop, :func:`replace` its ``replaceAll`` with ``$n`` references
(:func:`replacement_parts`), and :func:`split` ``Pattern.split`` as Spark calls it. The
continuous engine's row programs (:mod:`lockgate.plan.row_expressions`) use them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any


class NotTranslated(Exception):
    """A pattern, a replacement or a match lockgate does not evaluate as Java does:
    ``what`` names it, ``detail`` says why."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"{what}: {detail}")
        self.what = what
        self.detail = detail


_JAVA_DOT = "[^\\n\\r\\x85\\u2028\\u2029]"
"""Java's ``.``: any character but its line terminators (Python's excludes only ``\\n``)."""
_JAVA_DOLLAR = "(?:(?=\\r\\n\\Z)|(?<!\\r)(?=\\n\\Z)|(?=[\\r\\x85\\u2028\\u2029]\\Z)|\\Z)"
"""Java's ``$``: the end, or before a final line terminator (never inside ``\\r\\n``)."""
_CLASS_ESCAPES = set("dDwWsS")
_CHAR_ESCAPES = {"t": "\\t", "n": "\\n", "r": "\\r", "f": "\\f"}
_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")


def translate(pattern: str) -> str:
    """Java regular expression ``pattern`` as a Python one of the same meaning (compiled
    with ``re.ASCII``, Java's default for ``\\d \\w \\s``), or :class:`NotTranslated`.

    Accepted: literal characters, escaped punctuation, ``\\t \\n \\r \\f \\xhh \\uhhhh``,
    ``\\d \\D \\w \\W \\s \\S``, ``.``, simple ``[...]`` classes with ranges, ``^``, ``$``,
    ``\\A``, ``\\z``, ``|``, groups ``(...)``, ``(?:...)``, lookaheads ``(?=...)``,
    ``(?!...)``, and the greedy or lazy quantifiers ``* + ? {n} {n,} {n,m}``. Anything else
    (backreferences, named groups, lookbehinds, flags, possessive quantifiers, ``\\b``,
    ``\\p{..}``, ``\\Q..\\E``, class unions and intersections...) is refused, naming it."""

    def refuse(what: str) -> None:
        raise NotTranslated(
            f"the regular expression {pattern!r}",
            f"It uses {what}, which lockgate does not translate from Java's regular "
            "expressions to Python's. Supported: literals, . [...] classes, \\d \\w \\s, "
            "^ $ \\A \\z, |, (...) (?:...) (?=...) (?!...), and * + ? {n,m} (greedy or "
            "lazy).",
        )

    out: list[str] = []
    groups: list[bool] = []  # per open group: whether a quantifier may follow it
    quantifiable = False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            text, i = _regex_escape(pattern, i, refuse, in_class=False)
            out.append(text)
            quantifiable = text not in ("\\A", "\\Z")
            continue
        if c == "[":
            text, i = _regex_class(pattern, i, refuse)
            out.append(text)
            quantifiable = True
            continue
        if c in "*+?{":
            if c == "{":
                m = _QUANTIFIER.match(pattern, i)
                if m is None:
                    refuse(f"a '{{' that is not a quantifier at {i}")
                assert m is not None
                text, i = m.group(0), m.end()
            else:
                text, i = c, i + 1
            if not quantifiable:
                refuse(f"a quantifier {text!r} that follows no repeatable term")
            if i < n and pattern[i] == "+":
                refuse("a possessive quantifier")
            if i < n and pattern[i] == "?":
                text += "?"
                i += 1
            out.append(text)
            quantifiable = False
            continue
        i += 1
        if c == "(":
            if pattern.startswith("(?", i - 1):
                head = pattern[i - 1 : i + 2]
                if head not in ("(?:", "(?=", "(?!"):
                    refuse(f"the group construct {pattern[i - 1 : i + 3]!r}")
                out.append(head)
                groups.append(head == "(?:")
                i += 2
            else:
                out.append("(")
                groups.append(True)
            quantifiable = False
        elif c == ")":
            if not groups:
                refuse("an unbalanced ')'")
            out.append(")")
            quantifiable = groups.pop()
        elif c == "|":
            out.append("|")
            quantifiable = False
        elif c == "^":
            out.append("^")
            quantifiable = False
        elif c == "$":
            out.append(_JAVA_DOLLAR)
            quantifiable = False
        elif c == ".":
            out.append(_JAVA_DOT)
            quantifiable = True
        else:
            out.append(re.escape(c))
            quantifiable = True
    if groups:
        refuse("an unclosed group")
    text = "".join(out)
    try:
        re.compile(text, re.ASCII)
    except re.error as exc:
        refuse(f"a construct Python reads differently ({exc})")
    return text


def _regex_escape(
    pattern: str, i: int, refuse: Callable[[str], None], in_class: bool
) -> tuple[str, int]:
    if i + 1 >= len(pattern):
        refuse("a trailing backslash")
    d = pattern[i + 1]
    if d in _CLASS_ESCAPES:
        return "\\" + d, i + 2
    if d in _CHAR_ESCAPES:
        return _CHAR_ESCAPES[d], i + 2
    if d in "xu":
        width = 2 if d == "x" else 4
        digits = pattern[i + 2 : i + 2 + width]
        if len(digits) != width or any(ch not in "0123456789abcdefABCDEF" for ch in digits):
            refuse(f"the escape {pattern[i : i + 2 + width]!r}")
        code = int(digits, 16)
        if 0xD800 <= code <= 0xDFFF:
            refuse("a surrogate escape")
        return re.escape(chr(code)), i + 2 + width
    if not in_class and d in "Az":
        return ("\\A" if d == "A" else "\\Z"), i + 2
    if d.isascii() and d.isalnum():
        refuse(f"the escape '\\\\{d}'")
    return re.escape(d), i + 2


def _regex_class(pattern: str, i: int, refuse: Callable[[str], None]) -> tuple[str, int]:
    out = ["["]
    j, n = i + 1, len(pattern)
    if j < n and pattern[j] == "^":
        out.append("^")
        j += 1
    if j < n and pattern[j] == "]":
        refuse("a ']' first in a character class")
    items: list[tuple[str, bool]] = []  # (python text, is a single character)
    while j < n and pattern[j] != "]":
        c = pattern[j]
        if c == "[":
            refuse("a nested character class")
        if c == "&" and pattern.startswith("&&", j):
            refuse("a character class intersection")
        if c == "\\":
            text, j = _regex_escape(pattern, j, refuse, in_class=True)
            items.append((text, text[1:] not in _CLASS_ESCAPES))
            continue
        items.append(("-" if c == "-" else re.escape(c), c != "-"))
        j += 1
    if j >= n:
        refuse("an unclosed character class")
    if not items:
        refuse("an empty character class")
    for k, (text, single) in enumerate(items):
        if text == "-" and 0 < k < len(items) - 1:
            before, after = items[k - 1], items[k + 1]
            ranged_before = k >= 2 and items[k - 2][0] == "-"
            if not (before[1] and after[1]) or ranged_before or after[0] == "-":
                refuse("a '-' in a character class that is not a simple range")
        out.append(text)
    out.append("]")
    return "".join(out), j + 1


def replacement_parts(replacement: str, groups: int) -> tuple[Any, ...]:
    """Java's ``Matcher.appendReplacement`` syntax (``$n`` groups, ``\\x`` escapes) as parts:
    strings, and ints for groups."""

    def refuse(what: str) -> None:
        raise NotTranslated(
            f"the replacement {replacement!r}",
            f"It {what}; Spark fails such rows with INVALID_REGEXP_REPLACE.",
        )

    parts: list[Any] = []
    text: list[str] = []
    i, n = 0, len(replacement)
    while i < n:
        c = replacement[i]
        if c == "\\":
            if i + 1 >= n:
                refuse("ends with a backslash")
            text.append(replacement[i + 1])
            i += 2
        elif c == "$":
            if i + 1 >= n or not replacement[i + 1].isdigit() or not replacement[i + 1].isascii():
                refuse("has a '$' that is not a group number (named groups are not supported)")
            ref = int(replacement[i + 1])
            i += 2
            while i < n and replacement[i].isascii() and replacement[i].isdigit():
                longer = ref * 10 + int(replacement[i])
                if longer > groups:
                    break
                ref = longer
                i += 1
            if ref > groups:
                refuse(f"refers to group {ref} of a pattern with {groups}")
            if text:
                parts.append("".join(text))
                text = []
            parts.append(ref)
        else:
            text.append(c)
            i += 1
    if text:
        parts.append("".join(text))
    return tuple(parts)


def find_all(rx: re.Pattern[str], s: str) -> Iterator[re.Match[str]]:
    """The matches Java's ``Matcher.find`` loop sees: after an empty match the next search
    starts one character further (Python would try a longer match at the same place)."""
    pos, n = 0, len(s)
    while pos <= n:
        m = rx.search(s, pos)
        if m is None:
            return
        yield m
        if m.end() == m.start():
            if m.end() < n and ord(s[m.end()]) > 0xFFFF:
                # Java searches again from the middle of the UTF-16 surrogate pair and
                # splits the character (Spark then shows its halves as '?').
                raise NotTranslated(
                    f"an empty match of the regular expression {rx.pattern!r} before the "
                    f"character {s[m.end()]!r} (outside Unicode's Basic Multilingual Plane)",
                    "Java's regular expressions would split the character in two UTF-16 "
                    "halves, which lockgate does not reproduce.",
                )
            pos = m.end() + 1
        else:
            pos = m.end()


def replace(rx: re.Pattern[str], parts: tuple[Any, ...], s: str) -> str:
    """``s`` with every match Java's find loop sees replaced by ``parts``
    (:func:`replacement_parts`), as ``Matcher.replaceAll``."""
    out: list[str] = []
    last = 0
    for m in find_all(rx, s):
        out.append(s[last : m.start()])
        for part in parts:
            out.append(part if isinstance(part, str) else (m.group(part) or ""))
        last = m.end()
    out.append(s[last:])
    return "".join(out)


def split(rx: re.Pattern[str], s: str, limit: int) -> list[str]:
    """Java's ``Pattern.split`` as Spark calls it (a limit of 0 is -1: trailing empty
    strings stay), and Spark's own split of a non-empty string on an empty pattern."""
    if rx.pattern == "" and s and (limit <= 0 or limit >= len(s)):
        return list(s)
    parts: list[str] = []
    index = 0
    for m in find_all(rx, s):
        if limit <= 0 or len(parts) < limit - 1:
            if index == 0 and m.start() == 0 and m.end() == 0:
                continue  # no empty leading string for an empty match at the start
            parts.append(s[index : m.start()])
            index = m.end()
        else:  # the last part: later matches change nothing
            parts.append(s[index:])
            index = m.end()
            break
    if index == 0:
        return [s]
    if limit <= 0 or len(parts) < limit:
        parts.append(s[index:])
    return parts
