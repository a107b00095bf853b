"""A fast reader for the EDN that Jepsen histories are made of; edn-format reads the rest.

edn-format (a PLY grammar) reads about 0.5 MB/s: a 7.6 MB history took 14 s to parse and
0.03 s to check. Jepsen histories use a small part of EDN: maps, vectors, lists, sets,
keywords, strings, integers, floats, nil/true/false, symbols, `;` comments, `#_` discards and
a few tagged records. This reader handles exactly that part, with a lexer (one compiled token
pattern of the EDN grammar, not a pattern for op lines) and an explicit stack (no recursion,
so nesting depth is a checked limit rather than a crash), and returns the same objects
edn-format would for the importer (Keyword, Symbol, tuple for lists, frozenset for sets; maps
as dict and vectors as list, which the importer treats like edn-format's immutable ones).

Must never guess: anything outside that part (characters, ratios, `M` decimals, tags it does
not know, malformed input) raises Unsupported and the caller hands the whole text to
edn-format, whose reading and error messages are the reference. Non-finite floats and
nesting deeper than MAX_DEPTH raise EdnValueError with the line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from edn_format import Keyword, Symbol

MAX_DEPTH = 200  # Jepsen op maps nest 3 or 4 deep; 100,000 deep is an attack, not a history


class _Keyword(Keyword):
    """edn-format's Keyword, equal to it and hashing alike, without rebuilding an immutable
    dict on every hash (which cost more than the parsing of a history's map keys)."""

    _hashes: dict[str, int] = {}

    def __hash__(self) -> int:
        cached = self._hashes.get(self._name)
        if cached is None:
            cached = self._hashes[self._name] = Keyword.__hash__(self)
        return cached

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keyword) and other.name == self._name

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)


class Unsupported(Exception):
    """Input outside the part of EDN this reader handles: let edn-format read it."""


class EdnValueError(ValueError):
    """A readable but unacceptable value (NaN, infinity, absurd nesting), with its line."""

    def __init__(self, reason: str, line: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line


# One token after optional whitespace, commas and comments; the group number says its kind.
_TOKEN = re.compile(
    r"""
    (?:[\s,]+|;[^\n]*)*
    (?:
      (\#\{|[\[{(])                                                       # 1 open
    | ([\]})])                                                             # 2 close
    | (:[^\s,\[\]{}()"';\\\#][^\s,\[\]{}()"';\\]*)                          # 3 keyword
    | ([+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?N?(?=[\s,\[\]{}()";]|$))          # 4 number
    | ("(?:[^"\\]|\\.)*")                                                  # 5 string
    | (\#_)                                                                # 6 discard
    | (\#[A-Za-z][^\s,\[\]{}()"';\\]*)                                      # 7 tag
    | ([A-Za-z*!_?$%&=<>.|/+\-][^\s,\[\]{}()"';\\]*)                       # 8 symbol
    | (.)                                                                  # 9 anything else
    | $                                                                    # end
    )
    """,
    re.VERBOSE | re.DOTALL,
)
_OPEN, _CLOSE, _KEYWORD, _NUMBER, _STRING, _DISCARD, _TAG, _SYMBOL, _OTHER = range(1, 10)
_STRING_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_CLOSERS = {"[": "]", "(": ")", "{": "}", "#{": "}"}


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1)
    if code[0] == "u":
        return chr(int(code[1:], 16))
    if code not in _STRING_ESCAPES:
        raise Unsupported(f"string escape \\{code}")
    return _STRING_ESCAPES[code]


def read_all(text: str, tags: dict[str, Callable[[Any], Any]]) -> list[Any]:
    """Every top-level value of `text`; `tags` maps a tag name to its reader function."""
    keywords: dict[str, Keyword] = {}
    top: list[Any] = []
    # Open collections: (opening token, items, pending tags and discards before it)
    stack: list[tuple[str, list[Any], list[str]]] = []
    items = top
    prefixes: list[str] = []  # tags and discards waiting for the next value
    # Every character belongs to some match (group 9 takes any other), so nothing is skipped.
    for match in _TOKEN.finditer(text):
        kind = match.lastindex
        if kind == _KEYWORD:  # the most frequent token first
            token = match.group(kind)
            value = keywords.get(token)
            if value is None:
                value = keywords[token] = _Keyword(token[1:])
        elif kind == _NUMBER:
            token = match.group(kind)
            if "." in token or "e" in token or "E" in token:
                value = float(token)
                if not math.isfinite(value):
                    raise EdnValueError(f"number {token[:40]} is out of range (not finite)", _line(text, match))
            else:
                value = int(token[:-1] if token[-1] == "N" else token)
        elif kind == _OPEN:
            if len(stack) >= MAX_DEPTH:
                raise EdnValueError(f"values nested deeper than {MAX_DEPTH}", _line(text, match))
            stack.append((match.group(kind), items, prefixes))
            items = []
            prefixes = []
            continue
        elif kind == _CLOSE:
            if not stack or prefixes:
                raise Unsupported("unbalanced")
            opener, outer, prefixes = stack.pop()
            if _CLOSERS[opener] != match.group(kind):
                raise Unsupported("mismatched brackets")
            value = _collection(opener, items)
            items = outer
        elif kind == _STRING:
            body = match.group(kind)[1:-1]
            value = _ESCAPE.sub(_unescape, body) if "\\" in body else body
        elif kind == _SYMBOL:
            value = _symbol(match.group(kind))
        elif kind in (_DISCARD, _TAG):
            prefixes.append(match.group(kind))
            continue
        elif kind is None:
            continue  # whitespace and comments before the end
        else:
            raise Unsupported(f"unexpected {match.group(kind)!r}")
        while prefixes:
            prefix = prefixes.pop()
            if prefix == "#_":
                break
            handler = tags.get(prefix[1:])
            if handler is None:
                raise Unsupported(f"tag {prefix}")
            value = handler(value)
        else:
            items.append(value)
    if stack or prefixes:
        raise Unsupported("unterminated")
    return top


def _line(text: str, match: re.Match[str]) -> int:
    return text.count("\n", 0, match.start(match.lastindex or 0)) + 1


def _collection(opener: str, items: list[Any]) -> Any:
    if opener == "[":
        return items
    if opener == "(":
        return tuple(items)
    try:
        if opener == "{":
            if len(items) % 2:
                raise Unsupported("map with an odd number of forms")
            value = dict(zip(items[::2], items[1::2], strict=True))
            if len(value) * 2 != len(items):
                raise Unsupported("duplicate map key")
            return value
        return frozenset(items)
    except TypeError as exc:  # an unhashable key or element: edn-format's immutable types
        raise Unsupported(str(exc)) from None


def _symbol(token: str) -> Any:
    if token == "nil":
        return None
    if token == "true":
        return True
    if token == "false":
        return False
    if token[0] in "+-." and len(token) > 1 and token[1].isdigit():
        raise Unsupported(f"number {token!r}")
    return Symbol(token)
