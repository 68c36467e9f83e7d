"""Schema validation of plan documents in time linear in their size (issue 17 item 4).

`jsonschema` costs tens of microseconds per value (a validator object per descent, `$ref` lookups), so
a plan of 100k schedule steps took minutes to validate.  Nearly all of a plan is a few long arrays of
identical items (schedule steps, compute and data nodes, per-step byte counts, packed buffers).  Their
item schemas are compiled here, from the shipped schema itself, into plain predicates; `stripped`
checks every long array with its predicate and returns a copy of the document in which the arrays that
passed are empty, for `jsonschema` to validate the rest as before.

The predicates are conservative: they accept a value only when the schema does (an integer must be a
Python int, never a whole float such as 1.0, which the schema also accepts).  An array with any item
they do not accept is left in place, so `jsonschema` validates it and reports its first error, with its
JSON path, as without this module (a message that quotes an object holding an emptied array quotes
it emptied).  A schema keyword the compiler does not know makes its
array's predicate absent, and that array, too, is left to `jsonschema`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Predicate = Callable[[Any], bool]

#: arrays shorter than this are left to jsonschema (nothing to gain, and one code path fewer to trust)
MIN_ITEMS = 64
#: JSON types by name: exactly the Python types json.loads builds for them (bool is not an integer)
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "null": (type(None),),
    "array": (list,), "object": (dict,),
}
#: keywords that say nothing about a value
_ANNOTATIONS = {"description", "title", "$comment", "$schema", "$id", "$defs"}
#: an object's keywords that `stripped` descends through (besides annotations)
_KEY_KEYWORDS = {"type", "required", "properties", "additionalProperties"}


class _Unsupported(Exception):
    """A schema keyword (or form of one) the compiler does not handle."""


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """`schema`, or the local definition its lone `$ref` (plus annotations) points to."""
    ref = schema.get("$ref")
    if ref is None:
        return schema
    if set(schema) - _ANNOTATIONS - {"$ref"} or not ref.startswith("#/$defs/"):
        raise _Unsupported(ref)
    return _resolve(root["$defs"][ref.removeprefix("#/$defs/")], root)


def compile_predicate(schema: dict[str, Any], root: dict[str, Any]) -> Predicate | None:
    """A predicate that accepts a value only if `schema` does; None when the schema uses a keyword this
    compiler does not handle."""
    try:
        return _compile(schema, root)
    except _Unsupported:
        return None


def _compile(schema: dict[str, Any], root: dict[str, Any]) -> Predicate:
    schema = _resolve(schema, root)
    if set(schema) - _ANNOTATIONS == {"type", "minimum"} and schema["type"] == "integer":
        low = schema["minimum"]  # ids and byte counts: the most common leaf, one test
        return lambda v: type(v) is int and v >= low
    checks: list[Predicate] = []
    for key, arg in schema.items():
        if key in _ANNOTATIONS:
            continue
        check = _keyword(key, arg, schema, root)
        if check is not None:
            checks.append(check)
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(c(v) for c in checks)


def _is_number(v: Any) -> bool:
    return type(v) is int or type(v) is float


def _keyword(key: str, arg: Any, schema: dict[str, Any], root: dict[str, Any]) -> Predicate | None:
    """The check of one keyword (None: nothing to check on its own, e.g. `required` beside `properties`)."""
    if key == "type":
        names = [arg] if isinstance(arg, str) else list(arg)
        if any(n not in _TYPES for n in names):
            raise _Unsupported(arg)
        types = tuple(t for n in names for t in _TYPES[n])
        return lambda v: type(v) in types
    if key == "minimum":
        return lambda v: not _is_number(v) or v >= arg
    if key == "maximum":
        return lambda v: not _is_number(v) or v <= arg
    if key in ("enum", "const"):
        options = arg if key == "enum" else [arg]
        if not all(type(o) is str for o in options):  # JSON equality of numbers and booleans: not here
            raise _Unsupported(key)
        allowed = frozenset(options)
        return lambda v: type(v) is str and v in allowed
    if key == "properties":
        props = {name: _compile(sub, root) for name, sub in arg.items()}
        required = tuple(schema.get("required", ()))
        closed = schema.get("additionalProperties", True) is False

        def check_object(v: Any) -> bool:
            if type(v) is not dict:
                return True
            if any(r not in v for r in required) or (closed and any(k not in props for k in v)):
                return False
            return all(props[k](x) for k, x in v.items() if k in props)

        return check_object
    if key == "required":
        if "properties" in schema:
            return None  # checked with the properties
        return lambda v: type(v) is not dict or all(r in v for r in arg)
    if key == "additionalProperties":
        if "properties" in schema and arg is False:
            return None
        if "properties" in schema or not isinstance(arg, dict):
            raise _Unsupported(key)
        values = _compile(arg, root)
        return lambda v: type(v) is not dict or all(values(x) for x in v.values())
    if key == "items":
        item = _compile(arg, root)
        return lambda v: type(v) is not list or all(item(x) for x in v[len(schema.get("prefixItems", ())):])
    if key == "prefixItems":
        firsts = [_compile(sub, root) for sub in arg]
        return lambda v: type(v) is not list or all(c(x) for c, x in zip(firsts, v, strict=False))
    if key == "minItems":
        return lambda v: type(v) is not list or len(v) >= arg
    if key == "maxItems":
        return lambda v: type(v) is not list or len(v) <= arg
    raise _Unsupported(key)


def stripped(doc: Any, schema: dict[str, Any], root: dict[str, Any] | None = None) -> Any:
    """`doc` with every long array that the schema's item predicate fully accepts emptied (a copy; `doc`
    is not changed).  The schema accepts `doc` if and only if it accepts the copy."""
    root = schema if root is None else root
    try:
        schema = _resolve(schema, root)
    except _Unsupported:
        return doc
    schema = _only_branch(schema, doc, root)
    # keywords that look at keys only: emptying a value's arrays cannot change what they say
    if type(doc) is dict and "properties" in schema and set(schema) - _ANNOTATIONS <= _KEY_KEYWORDS:
        props = schema["properties"]
        out = dict(doc)
        for key, value in doc.items():
            if key in props:
                out[key] = _stripped_value(value, props[key], root)
        return out
    extra = schema.get("additionalProperties")
    if type(doc) is dict and isinstance(extra, dict) and set(schema) - _ANNOTATIONS <= {"type",
                                                                                      "additionalProperties"}:
        return {key: _stripped_value(value, extra, root) for key, value in doc.items()}
    return doc


def _stripped_value(value: Any, schema: dict[str, Any], root: dict[str, Any]) -> Any:
    try:
        resolved = _resolve(schema, root)
    except _Unsupported:
        return value
    plain = set(resolved) - _ANNOTATIONS <= {"type", "items"} and resolved.get("type") in (None, "array")
    if type(value) is list and len(value) >= MIN_ITEMS and "items" in resolved and plain:
        return [] if _all_items(value, resolved["items"], root) else value
    return stripped(value, resolved, root)


def _all_items(value: list[Any], schema: dict[str, Any], root: dict[str, Any]) -> bool:
    """Whether the item schema accepts every item; a list of integers against a bare integer bound (the
    per-step byte counts, most of a plan) in one pass of C loops."""
    try:
        item = _resolve(schema, root)
    except _Unsupported:
        return False
    if set(item) - _ANNOTATIONS <= {"type", "minimum"} and item.get("type") == "integer":
        low = item.get("minimum")
        return set(map(type, value)) <= {int} and (low is None or min(value) >= low)
    predicate = _items_predicate(schema, root)
    return predicate is not None and all(map(predicate, value))


_PREDICATES: dict[int, tuple[dict[str, Any], Predicate | None]] = {}


def _items_predicate(schema: dict[str, Any], root: dict[str, Any]) -> Predicate | None:
    """The compiled predicate of an item schema, compiled once per schema object."""
    hit = _PREDICATES.get(id(schema))
    if hit is None or hit[0] is not schema:
        hit = (schema, compile_predicate(schema, root))
        _PREDICATES[id(schema)] = hit
    return hit[1]


def _only_branch(schema: dict[str, Any], doc: Any, root: dict[str, Any]) -> dict[str, Any]:
    """For a `oneOf` whose other branches are plain JSON types `doc` is not (e.g. "null or a packing"),
    the one branch `doc` can match; any other schema as it is.  Stripping inside that branch keeps
    the others failing (they fail on the value's type, which stripping keeps)."""
    branches = schema.get("oneOf")
    if branches is None or set(schema) - _ANNOTATIONS != {"oneOf"}:
        return schema
    try:
        resolved = [_resolve(b, root) for b in branches]
    except _Unsupported:
        return {}
    open_branches = []
    for b in resolved:
        names = b.get("type")
        if set(b) == {"type"} and isinstance(names, str) and names in _TYPES:
            if type(doc) in _TYPES[names]:
                return {}  # a bare type branch the value matches: nothing to strip safely
            continue
        open_branches.append(b)
    return open_branches[0] if len(open_branches) == 1 else {}
