"""JMS / SQL-92 message selectors, compiled once into closures.

The grammar is parsed with lark's LALR parser (linear time); the tree is
then checked (length, nesting depth, static types of literals) and turned
into nested closures, so evaluating a selector visits each of its nodes at
most once. Values follow SQL's three-valued logic: ``None`` is UNKNOWN, a
missing header is NULL, a comparison between different types is UNKNOWN,
and a binding matches only when its selector is TRUE.

Identifiers name message headers; the JMS header names map onto AMQP basic
properties (see ``JMS_PROPERTIES``). A header whose name is not a Java
identifier (``x-rate``) can be written as a double-quoted identifier.
"""

from __future__ import annotations

import decimal
import functools
import operator
from collections.abc import Callable
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from brokerd.model.muxers.glob import like_pattern

#: longest selector accepted, in UTF-8 bytes (ActiveMQ and Artemis use similar bounds)
MAX_SELECTOR_BYTES = 4096
#: deepest nesting of operators accepted (``NOT NOT ...``, ``((((...))))``)
MAX_DEPTH = 64

GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: _NOT not_expr -> not_
         | predicate
?predicate: sum COMPARE sum -> compare
          | sum _BETWEEN sum _AND sum -> between
          | sum _NOT _BETWEEN sum _AND sum -> not_between
          | sum _IN "(" literal ("," literal)* ")" -> in_
          | sum _NOT _IN "(" literal ("," literal)* ")" -> not_in
          | sum _LIKE STRING (_ESCAPE STRING)? -> like
          | sum _NOT _LIKE STRING (_ESCAPE STRING)? -> not_like
          | sum _IS _NULL -> is_null
          | sum _IS _NOT _NULL -> is_not_null
          | sum
?sum: product (ADDOP product)*
?product: unary (MULOP unary)*
?unary: ADDOP unary -> sign
      | atom
?atom: literal
     | IDENT -> ident
     | QUOTED_IDENT -> quoted_ident
     | "(" or_expr ")"
?literal: STRING -> string
        | NUMBER -> number
        | _TRUE -> true
        | _FALSE -> false

COMPARE: "<>" | "<=" | ">=" | "=" | "<" | ">"
ADDOP: "+" | "-"
MULOP: "*" | "/"
_OR: "OR"i
_AND: "AND"i
_NOT: "NOT"i
_BETWEEN: "BETWEEN"i
_IN: "IN"i
_LIKE: "LIKE"i
_ESCAPE: "ESCAPE"i
_IS: "IS"i
_NULL: "NULL"i
_TRUE: "TRUE"i
_FALSE: "FALSE"i
STRING: /'([^']|'')*'/
QUOTED_IDENT: /"([^"]|"")+"/
NUMBER: /([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[lLfFdD]?/
IDENT: /[A-Za-z_$][A-Za-z0-9_$]*/
%ignore /[ \t\r\n]+/
"""

_PARSER = Lark(GRAMMAR, parser="lalr", maybe_placeholders=False, propagate_positions=False)

#: JMS header fields and the AMQP basic properties they read
JMS_PROPERTIES = {
    "JMSCorrelationID": "correlation_id",
    "JMSMessageID": "message_id",
    "JMSType": "message_type",
    "JMSPriority": "priority",
    "JMSReplyTo": "reply_to",
    "JMSDeliveryMode": "delivery_mode",
    "JMSTimestamp": "timestamp",
}


class SelectorError(ValueError):
    """A selector that cannot be compiled; the text says where and why."""


class Fields:
    """What a selector reads from one message: its headers and basic properties."""

    __slots__ = ("headers", "properties")

    def __init__(self, headers: dict[str, Any], properties: Any) -> None:
        self.headers = headers
        self.properties = properties


Evaluator = Callable[[Fields], Any]

# static kinds of a sub-expression, for the checks made at bind time
BOOL, NUM, STR, ANY = "boolean", "numeric", "string", "any"


def normalise(value: Any) -> Any:
    """A header value as a selector sees it: bool, int, float, str, or None (NULL)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return None
    return None  # tables, arrays, timestamps: not comparable in a selector


def _jms_property(name: str, fields: Fields) -> Any:
    props = fields.properties
    value = getattr(props, JMS_PROPERTIES[name], None)
    if name == "JMSDeliveryMode":
        return None if value is None else ("PERSISTENT" if value == 2 else "NON_PERSISTENT")
    if name == "JMSTimestamp" and value is not None:
        return int(value.timestamp() * 1000)  # JMS counts milliseconds
    return normalise(value)


@functools.lru_cache(maxsize=1024)
def compile_selector(text: str) -> Evaluator:
    """Parse, check and compile a selector; raises SelectorError saying where and why.

    Cached by text: bindings with the same selector share one compiled closure."""
    size = len(text.encode("utf-8", "replace"))
    if size > MAX_SELECTOR_BYTES:
        raise SelectorError(f"selector is {size} bytes, longer than {MAX_SELECTOR_BYTES}")
    if not text.strip():
        raise SelectorError("selector is empty")
    try:
        tree = _PARSER.parse(text)
    except UnexpectedInput as exc:
        raise SelectorError(_describe(exc, text)) from None
    depth = _depth(tree)
    if depth > MAX_DEPTH:
        raise SelectorError(f"selector nests {depth} levels deep, more than {MAX_DEPTH}")
    kind, fn = _Compiler().build(tree)
    if kind not in (BOOL, ANY):
        raise SelectorError(f"selector is a {kind} expression, not a condition")
    return _condition(kind, fn)


def _condition(kind: str, fn: Evaluator) -> Evaluator:
    """A header used as a condition is TRUE/FALSE only if it is a boolean."""
    if kind == BOOL:
        return fn
    return lambda f: v if isinstance(v := fn(f), bool) else None


def matches(evaluator: Evaluator, fields: Fields) -> bool:
    """TRUE routes; FALSE and UNKNOWN do not."""
    return evaluator(fields) is True


def _describe(exc: UnexpectedInput, text: str) -> str:
    pos = getattr(exc, "pos_in_stream", None)
    column = getattr(exc, "column", None)
    where = f"column {column}" if isinstance(column, int) and column > 0 else "the end"
    if isinstance(exc, UnexpectedCharacters):
        char = text[pos] if isinstance(pos, int) and 0 <= pos < len(text) else "?"
        return f"syntax error at {where}: unexpected character {char!r}"
    if isinstance(exc, UnexpectedToken):
        token = exc.token
        if token.type == "$END":
            return "syntax error at the end: the selector is incomplete"
        expected = sorted(_TERMINAL_NAMES.get(t, t) for t in exc.expected)[:6]
        return (
            f"syntax error at {where}: unexpected {str(token)!r}, expected {' or '.join(expected)}"
        )
    if isinstance(exc, UnexpectedEOF):
        return "syntax error at the end: the selector is incomplete"
    return f"syntax error at {where}"


_TERMINAL_NAMES = {
    "_OR": "OR",
    "_AND": "AND",
    "_NOT": "NOT",
    "_BETWEEN": "BETWEEN",
    "_IN": "IN",
    "_LIKE": "LIKE",
    "_ESCAPE": "ESCAPE",
    "_IS": "IS",
    "_NULL": "NULL",
    "_TRUE": "TRUE",
    "_FALSE": "FALSE",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "IDENT": "an identifier",
    "QUOTED_IDENT": "a quoted identifier",
    "STRING": "a string",
    "NUMBER": "a number",
    "COMPARE": "a comparison",
    "ADDOP": "'+' or '-'",
    "MULOP": "'*' or '/'",
}


def _depth(tree: Tree) -> int:
    """Nesting depth of the parse tree, without recursion (the tree may be deep)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, Tree):
            stack.extend((child, depth + 1) for child in node.children)
    return deepest


# -- three-valued logic ---------------------------------------------------------------


def _and(parts: list[Evaluator]) -> Evaluator:
    def evaluate(fields: Fields) -> Any:
        result: Any = True
        for part in parts:
            value = part(fields)
            if value is False:
                return False
            if value is not True:
                result = None
        return result

    return evaluate


def _or(parts: list[Evaluator]) -> Evaluator:
    def evaluate(fields: Fields) -> Any:
        result: Any = False
        for part in parts:
            value = part(fields)
            if value is True:
                return True
            if value is not False:
                result = None
        return result

    return evaluate


def _not(inner: Evaluator) -> Evaluator:
    def evaluate(fields: Fields) -> Any:
        value = inner(fields)
        return (not value) if isinstance(value, bool) else None

    return evaluate


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def compare_values(op: str, left: Any, right: Any) -> Any:
    """SQL comparison: UNKNOWN for NULLs and mixed types; strings and booleans
    only compare for (in)equality, as JMS says."""
    if left is None or right is None:
        return None
    if _is_number(left) and _is_number(right):
        pass
    elif type(left) is not type(right) or op not in ("=", "<>"):
        return None
    if op == "=":
        return left == right
    if op == "<>":
        return left != right
    return _ORDER[op](left, right)


def _arith(op: str, left: Any, right: Any) -> Any:
    if not (_is_number(left) and _is_number(right)):
        return None
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        return None  # division by zero is UNKNOWN, not an error
    if isinstance(left, int) and isinstance(right, int):
        return int(left / right)  # integer division truncates toward zero, as in Java
    return left / right


class _Compiler:
    """Parse tree -> (static kind, closure)."""

    def build(self, node: Any) -> tuple[str, Evaluator]:
        if isinstance(node, Token):  # a bare token can only be an identifier
            return self._ident(str(node))
        handler = getattr(self, "_" + node.data.rstrip("_"), None)
        if handler is None:
            raise SelectorError(f"unsupported construct {node.data}")
        return handler(node)

    def _logic(self, node: Tree, name: str) -> list[Evaluator]:
        parts = []
        for child in node.children:
            kind, fn = self.build(child)
            if kind not in (BOOL, ANY):
                raise SelectorError(f"{name} needs conditions, got a {kind} expression")
            parts.append(_condition(kind, fn))
        return parts

    def _or_expr(self, node: Tree) -> tuple[str, Evaluator]:
        return BOOL, _or(self._logic(node, "OR"))

    def _and_expr(self, node: Tree) -> tuple[str, Evaluator]:
        return BOOL, _and(self._logic(node, "AND"))

    def _not(self, node: Tree) -> tuple[str, Evaluator]:
        return BOOL, _not(self._logic(node, "NOT")[0])

    def _compare(self, node: Tree) -> tuple[str, Evaluator]:
        left, op, right = node.children
        lk, lf = self.build(left)
        rk, rf = self.build(right)
        op = str(op)
        if ANY not in (lk, rk) and lk != rk:
            raise SelectorError(f"cannot compare a {lk} with a {rk}")
        if op not in ("=", "<>") and BOOL in (lk, rk):
            raise SelectorError(f"booleans cannot be compared with {op}")
        if op not in ("=", "<>") and STR in (lk, rk):
            raise SelectorError(f"strings cannot be compared with {op} (only = and <>)")
        return BOOL, lambda f: compare_values(op, lf(f), rf(f))

    def _between(self, node: Tree, negate: bool = False) -> tuple[str, Evaluator]:
        fns = []
        for child in node.children:
            kind, fn = self.build(child)
            if kind not in (NUM, ANY):
                raise SelectorError(f"BETWEEN needs numeric operands, got a {kind}")
            fns.append(fn)
        value, low, high = fns

        def evaluate(fields: Fields) -> Any:
            v = value(fields)
            both = _and_values(
                compare_values(">=", v, low(fields)), compare_values("<=", v, high(fields))
            )
            return _not_value(both) if negate else both

        return BOOL, evaluate

    def _not_between(self, node: Tree) -> tuple[str, Evaluator]:
        return self._between(node, negate=True)

    def _in(self, node: Tree, negate: bool = False) -> tuple[str, Evaluator]:
        kind, value = self.build(node.children[0])
        literals = [self._literal(child) for child in node.children[1:]]
        if kind not in (STR, NUM, ANY) or any(k not in (STR, NUM) for k, _ in literals):
            raise SelectorError("IN compares a string or number with literals")
        strings = frozenset(v for k, v in literals if k == STR)
        numbers = frozenset(v for k, v in literals if k == NUM)

        def evaluate(fields: Fields) -> Any:
            v = value(fields)
            if isinstance(v, str):
                found: Any = v in strings
            elif _is_number(v):
                found = v in numbers
            else:
                return None
            return (not found) if negate else found

        return BOOL, evaluate

    def _not_in(self, node: Tree) -> tuple[str, Evaluator]:
        return self._in(node, negate=True)

    def _like(self, node: Tree, negate: bool = False) -> tuple[str, Evaluator]:
        kind, value = self.build(node.children[0])
        if kind not in (STR, ANY):
            raise SelectorError(f"LIKE needs a string, got a {kind}")
        pattern = _unquote(node.children[1])
        escape = _unquote(node.children[2]) if len(node.children) > 2 else None
        if escape is not None and len(escape) != 1:
            raise SelectorError(f"the ESCAPE of LIKE must be one character, got {escape!r}")
        try:
            glob = like_pattern(pattern, escape)
        except ValueError as exc:
            raise SelectorError(str(exc)) from None

        def evaluate(fields: Fields) -> Any:
            v = value(fields)
            if not isinstance(v, str):
                return None
            return glob.match(v) is not negate

        return BOOL, evaluate

    def _not_like(self, node: Tree) -> tuple[str, Evaluator]:
        return self._like(node, negate=True)

    def _is_null(self, node: Tree) -> tuple[str, Evaluator]:
        _, value = self.build(node.children[0])
        return BOOL, lambda f: value(f) is None

    def _is_not_null(self, node: Tree) -> tuple[str, Evaluator]:
        _, value = self.build(node.children[0])
        return BOOL, lambda f: value(f) is not None

    def _arith_chain(self, node: Tree) -> tuple[str, Evaluator]:
        children = node.children
        kind, first = self.build(children[0])
        steps: list[tuple[str, Evaluator]] = []
        for op, operand in zip(children[1::2], children[2::2], strict=True):
            okind, fn = self.build(operand)
            steps.append((str(op), fn))
            for k in (kind, okind):
                if k not in (NUM, ANY):
                    raise SelectorError(f"arithmetic needs numbers, got a {k}")

        def evaluate(fields: Fields) -> Any:
            acc = first(fields)
            for op, fn in steps:
                acc = _arith(op, acc, fn(fields))
            return acc

        return NUM, evaluate

    _sum = _arith_chain
    _product = _arith_chain

    def _sign(self, node: Tree) -> tuple[str, Evaluator]:
        op, operand = node.children
        kind, fn = self.build(operand)
        if kind not in (NUM, ANY):
            raise SelectorError(f"a sign needs a number, got a {kind}")
        if str(op) == "+":
            return NUM, lambda f: v if _is_number(v := fn(f)) else None
        return NUM, lambda f: -v if _is_number(v := fn(f)) else None

    def _ident(self, node: Any) -> tuple[str, Evaluator]:
        name = str(node.children[0]) if isinstance(node, Tree) else str(node)
        if name in JMS_PROPERTIES:
            kind = NUM if name in ("JMSPriority", "JMSTimestamp") else STR
            return kind, functools.partial(_jms_property, name)
        return ANY, lambda f: normalise(f.headers.get(name))

    def _quoted_ident(self, node: Tree) -> tuple[str, Evaluator]:
        name = str(node.children[0])[1:-1].replace('""', '"')
        return ANY, lambda f: normalise(f.headers.get(name))

    def _literal(self, node: Any) -> tuple[str, Any]:
        if not isinstance(node, Tree) or node.data not in ("string", "number", "true", "false"):
            raise SelectorError("IN lists hold literals only")
        kind, fn = self.build(node)
        return kind, fn(Fields({}, None))

    def _string(self, node: Tree) -> tuple[str, Evaluator]:
        value = _unquote(node.children[0])
        return STR, lambda f: value

    def _number(self, node: Tree) -> tuple[str, Evaluator]:
        text = str(node.children[0]).rstrip("lLfFdD")
        if any(c in text for c in ".eE"):
            value: int | float = float(text)
        else:
            value = int(text)
        return NUM, lambda f: value

    def _true(self, node: Tree) -> tuple[str, Evaluator]:
        return BOOL, lambda f: True

    def _false(self, node: Tree) -> tuple[str, Evaluator]:
        return BOOL, lambda f: False


def _and_values(a: Any, b: Any) -> Any:
    if a is False or b is False:
        return False
    if a is True and b is True:
        return True
    return None


def _not_value(value: Any) -> Any:
    return (not value) if isinstance(value, bool) else None


def _unquote(token: Any) -> str:
    return str(token)[1:-1].replace("''", "'")
