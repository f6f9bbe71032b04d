"""JSON Schema (a subset) -> GBNF, for constrained decoding of structured output.

Every output the grammar allows is a JSON text that validates against the schema; the grammar
may allow less than the schema (properties come in the declared order, no properties beyond the
declared ones, at most 16 integer digits), never more. Keywords outside the subset raise
SchemaError naming the keyword and where it is, so the server can answer 400."""
import json
import math
import re

from colibri.grammar import gbnf, schema_limits
from colibri.grammar.errors import SchemaError
from colibri.grammar.ranges import int_range
from colibri.grammar.regex import MAX_REPEAT, PatternError, pattern_to_gbnf

# Keywords that say nothing about which instances are valid.
ANNOTATIONS = frozenset(("title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                         "readOnly", "writeOnly", "$defs", "definitions", "discriminator", "$anchor", "contentMediaType",
                         "contentEncoding"))
BY_TYPE = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "number": set(),
    "boolean": set(),
    "null": set(),
}
GENERIC = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"}
TYPES = tuple(BY_TYPE)
SUPPORTED = ("type (object, array, string, number, integer, boolean, null), properties, required, "
             "additionalProperties, items, minItems, maxItems, minLength, maxLength, pattern, format (date, time, "
             "date-time, uuid; others are annotations), enum, const, anyOf, oneOf, allOf (one schema), $ref to "
             "$defs/definitions, integer minimum/maximum/exclusiveMinimum/exclusiveMaximum")

PRIMITIVES = {
    "ws": '| " " | "\\n" [ \\t]{0,20}',
    "char": '[^"\\\\\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "string": '"\\"" {p}char* "\\""',
    "integer": '"-"? ("0" | [1-9] [0-9]{0,15})',
    "number": '{p}integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?',
    "boolean": '"true" | "false"',
    "null": '"null"',
    "value": '{p}object | {p}array | {p}string | {p}number | {p}boolean | {p}null',
    "object": '"{" {p}ws ( {p}string {p}ws ":" {p}ws {p}value {p}ws ( "," {p}ws {p}string {p}ws ":" {p}ws {p}value '
              '{p}ws )* )? "}"',
    "array": '"[" {p}ws ( {p}value {p}ws ( "," {p}ws {p}value {p}ws )* )? "]"',
}
# Fixed formats: JSON Schema's format names (RFC 3339 dates and times, RFC 4122 UUIDs).
FORMATS = {
    "date": '[0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])',
    "time": '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})? '
            '("Z" | "z" | [-+] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])',
    "uuid": '[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}',
}
FORMATS["date-time"] = FORMATS["date"].replace('"3" [01])', '"3" [01]) [Tt ] ') + \
    " " + FORMATS["time"]


def _name_part(s):
    return re.sub(r"[^A-Za-z0-9-]+", "-", str(s)).strip("-") or "x"


class _Compiler:
    def __init__(self, root, prefix):
        if prefix and not re.fullmatch(r"[A-Za-z0-9-]+", prefix):
            raise ValueError(f"grammar rule prefix {prefix!r} must match [A-Za-z0-9-]+")
        self.root, self.p = root, prefix
        self.rules = {}  # name -> body, in definition order
        self.refs = {}   # $ref -> rule name
        self.level = 0   # nesting of value() calls (schema_limits.MAX_DEPTH)

    def prim(self, name):
        full = self.p + name
        if full not in self.rules:
            body = PRIMITIVES[name]
            self.rules[full] = None  # reserve: primitives refer to each other
            for dep in re.findall(r"\{p\}([a-z]+)", body):
                self.prim(dep)
            self.rules[full] = body.replace("{p}", self.p)
        return full

    def new_rule(self, hint, body=None):
        base = self.p + _name_part(hint)
        name, k = base, 1
        while name in self.rules:
            k += 1
            name = f"{base}-{k}"
        self.rules[name] = body
        return name

    def fail(self, keyword, path, why=None):
        raise SchemaError(keyword, path, why or f"not supported by constrained decoding (supported: {SUPPORTED})")

    # ---- the schema walk: each returns a GBNF expression for one JSON value, no surrounding whitespace
    def value(self, s, path, hint):
        if self.level >= schema_limits.MAX_DEPTH:
            raise schema_limits.too_deep()
        self.level += 1
        try:
            return self._value(s, path, hint)
        finally:
            self.level -= 1

    def _value(self, s, path, hint):
        if s is True or s == {}:
            return self.prim("value")
        if s is False:
            self.fail("false", path, "the schema 'false' matches nothing, so no output can satisfy it")
        if not isinstance(s, dict):
            self.fail(type(s).__name__, path, "a schema must be an object or a boolean")
        keys = set(s) - ANNOTATIONS
        if "$ref" in s:
            self.only(s, {"$ref"}, path)
            return self.ref(s["$ref"], path)
        for comb in ("anyOf", "oneOf"):
            if comb in s:
                self.only(s, {comb}, path)
                subs = s[comb]
                if not isinstance(subs, list) or not subs:
                    self.fail(comb, path, "must be a non-empty list of schemas")
                if comb == "oneOf":
                    self.exclusive(subs, path)
                return "(" + " | ".join(self.value(x, f"{path}/{comb}/{i}", f"{hint}-{i}")
                                        for i, x in enumerate(subs)) + ")"
        if "allOf" in s:
            self.only(s, {"allOf"}, path)
            subs = s["allOf"]
            if not isinstance(subs, list) or len(subs) != 1:
                self.fail("allOf", path, "only an allOf of exactly one schema is supported")
            return self.value(subs[0], f"{path}/allOf/0", hint)
        if "const" in s or "enum" in s:
            return self.choices(s, path)
        t = s.get("type")
        if t is None:
            implied = [k for k, ks in BY_TYPE.items() if keys & ks]
            if len(implied) > 1 or (implied and implied[0] == "integer"):
                self.fail(sorted(keys & BY_TYPE[implied[-1]])[0], path, "give 'type' with these keywords")
            if not implied:
                unknown = sorted(keys - GENERIC)
                if unknown:
                    self.fail(unknown[0], path)
                return self.prim("value")
            t = implied[0]
        types = t if isinstance(t, list) else [t]
        if not types or any(x not in TYPES for x in types):
            self.fail("type", path, f"must be one of {', '.join(TYPES)} (or a list of them), not {t!r}")
        allowed = set().union(*(BY_TYPE[x] for x in types)) | {"type"}
        if "integer" in types and "number" in types:
            types = [x for x in types if x != "integer"]
        for k in sorted(keys):
            if k not in allowed:
                self.fail(k, path)
        alts = [self.typed(x, s, path, hint) for x in types]
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

    def exclusive(self, subs, path):
        """oneOf needs exactly one branch to match; the grammar would let a value through that
        two branches match, so the branches must be told apart by JSON type or by a required
        property of distinct constant values (a discriminator)."""
        kinds = [self.kinds(x) for x in subs]
        for i in range(len(subs)):
            for j in range(i):
                common = kinds[i] & kinds[j]
                if not common or (common == {"object"} and self.discriminated(subs[i], subs[j])):
                    continue
                ci, cj = self.consts(subs[i]), self.consts(subs[j])
                if ci is not None and cj is not None and not set(map(_key, ci)) & set(map(_key, cj)):
                    continue
                self.fail("oneOf", path, f"branches {j} and {i} can match the same value, which oneOf forbids and "
                                         "constrained decoding cannot rule out; use anyOf, or tell the branches apart "
                                         "by type or by a required property with distinct const values")

    def deref(self, s, depth=0):
        while isinstance(s, dict) and "$ref" in s and depth < 50:
            s, depth = self._resolve(s["$ref"], ""), depth + 1
        if isinstance(s, dict) and "allOf" in s and isinstance(s["allOf"], list) and len(s["allOf"]) == 1:
            return self.deref(s["allOf"][0], depth + 1)
        return s

    def kinds(self, s):
        """The JSON kinds (integer counts as number) a schema can produce."""
        s = self.deref(s)
        every = {"object", "array", "string", "number", "boolean", "null"}
        if not isinstance(s, dict):
            return every
        for comb in ("anyOf", "oneOf"):
            if isinstance(s.get(comb), list):
                return set().union(*(self.kinds(x) for x in s[comb])) if s[comb] else every
        if "const" in s or "enum" in s:
            vals = [s["const"]] if "const" in s else s["enum"] if isinstance(s["enum"], list) else []
            return {_kind(v) for v in vals}
        t = s.get("type")
        if t is None:
            implied = {k for k, ks in BY_TYPE.items() if set(s) & ks}
            return {"number" if k == "integer" else k for k in implied} or every
        return {"number" if x == "integer" else x for x in (t if isinstance(t, list) else [t]) if isinstance(x, str)}

    def consts(self, s):
        """The values a const/enum schema allows, or None."""
        s = self.deref(s)
        if isinstance(s, dict) and "const" in s:
            return [s["const"]]
        if isinstance(s, dict) and isinstance(s.get("enum"), list):
            return s["enum"]
        return None

    def discriminated(self, a, b):
        a, b = self.deref(a), self.deref(b)
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return False
        pa, pb = a.get("properties", {}), b.get("properties", {})
        for k in set(a.get("required", [])) & set(b.get("required", [])):
            ca, cb = self.consts(pa.get(k, {})), self.consts(pb.get(k, {}))
            if ca is not None and cb is not None and not set(map(_key, ca)) & set(map(_key, cb)):
                return True
        return False

    def only(self, s, keys, path):
        extra = sorted(set(s) - ANNOTATIONS - keys)
        if extra:
            self.fail(extra[0], path, f"cannot be combined with {'/'.join(sorted(keys))} here")

    def ref(self, ref, path):
        if not isinstance(ref, str):
            self.fail("$ref", path, "must be a string")
        if ref in self.refs:
            return self.refs[ref]
        m = re.fullmatch(r"#(?:/(\$defs|definitions)/([^/]+))?", ref)
        target = self._resolve(ref, path)
        seen, alias = {ref}, target
        while isinstance(alias, dict) and set(alias) - ANNOTATIONS == {"$ref"}:  # a chain of plain $refs
            nxt = alias["$ref"]
            if nxt in seen:
                self.fail("$ref", path, f"{ref!r} refers back to itself without any schema in between")
            seen.add(nxt)
            alias = self._resolve(nxt, path)
        name = self.new_rule("def-" + (m.group(2) or "root"))
        self.refs[ref] = name
        self.rules[name] = self.value(target, ref, name)
        return name

    def _resolve(self, ref, path):
        m = re.fullmatch(r"#(?:/(\$defs|definitions)/([^/]+))?", ref) if isinstance(ref, str) else None
        if not m:
            self.fail("$ref", path, f"only '#', '#/$defs/NAME' and '#/definitions/NAME' are supported, not {ref!r}")
        if not m.group(1):
            return self.root
        table = self.root.get(m.group(1)) if isinstance(self.root, dict) else None
        key = m.group(2).replace("~1", "/").replace("~0", "~")
        if not isinstance(table, dict) or key not in table:
            self.fail("$ref", path, f"{ref!r} names no schema in this document")
        return table[key]

    def choices(self, s, path):
        if "const" in s:
            self.only(s, {"const", "type"}, path)
            vals = [s["const"]]
        else:
            self.only(s, {"enum", "type"}, path)
            vals = s["enum"]
            if not isinstance(vals, list) or not vals:
                self.fail("enum", path, "must be a non-empty list")
        t = s.get("type")
        if t is not None:  # a typed enum: keep the members of that type
            types = t if isinstance(t, list) else [t]
            vals = [v for v in vals if any(_is_type(v, x) for x in types)]
            if not vals:
                self.fail("enum" if "enum" in s else "const", path, f"no value is of type {t!r}")
        return "(" + " | ".join(self.const(v) for v in vals) + ")"

    def const(self, v):
        """Exactly the JSON value v, with any whitespace inside objects and arrays."""
        if isinstance(v, dict):
            ws = self.prim("ws")
            kvs = [f'{gbnf.literal(json.dumps(k, ensure_ascii=False))} {ws} ":" {ws} {self.const(x)} {ws}'
                   for k, x in v.items()]
            return f'"{{" {ws} ' + ' "," '.join(f"{ws} {kv}" if i else kv for i, kv in enumerate(kvs)) + ' "}"'
        if isinstance(v, list):
            ws = self.prim("ws")
            items = [f"{self.const(x)} {ws}" for x in v]
            return f'"[" {ws} ' + ' "," '.join(f"{ws} {it}" if i else it for i, it in enumerate(items)) + ' "]"'
        return gbnf.literal(json.dumps(v, ensure_ascii=False))

    def typed(self, t, s, path, hint):
        if t == "object":
            return self.obj(s, path, hint)
        if t == "array":
            return self.arr(s, path, hint)
        if t == "string":
            return self.string(s, path, hint)
        if t == "integer":
            return self.integer(s, path)
        return self.prim(t)

    def integer(self, s, path):
        bounds = {}
        for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if k in s:
                v = s[k]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) > 1e300:
                    self.fail(k, path, "must be a number")
                bounds[k] = v
        if not bounds:
            return self.prim("integer")
        lows = [math.ceil(v) if k == "minimum" else math.floor(v) + 1
                for k, v in bounds.items() if k in ("minimum", "exclusiveMinimum")]
        highs = [math.floor(v) if k == "maximum" else math.ceil(v) - 1
                 for k, v in bounds.items() if k in ("maximum", "exclusiveMaximum")]
        lo, hi = max(lows, default=None), min(highs, default=None)
        expr = int_range(lo, hi)
        if expr is None:
            self.fail(sorted(bounds)[0], path, "no integer lies between the bounds; no output can satisfy it")
        return expr

    def obj(self, s, path, hint):
        props = s.get("properties", {})
        if not isinstance(props, dict):
            self.fail("properties", path, "must be an object")
        req = s.get("required", [])
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            self.fail("required", path, "must be a list of strings")
        extra = s.get("additionalProperties", True)
        if not props and not req:
            if extra is True or extra == {}:
                return self.prim("object")
            if extra is False:
                return '"{" ' + self.prim("ws") + ' "}"'
            return self.map(extra, path, hint)
        if not isinstance(extra, bool) and not isinstance(extra, dict):
            self.fail("additionalProperties", path, "must be a boolean or a schema")
        names = list(props) + [r for r in req if r not in props]
        if extra is False and len(names) > len(props):
            missing = names[len(props)]
            self.fail("required", path, f"requires '{missing}', which 'properties' does not define and "
                                        "additionalProperties false forbids; no output can satisfy it")
        ws = self.prim("ws")
        kvs = []
        for k in names:
            sub = props.get(k, True)
            v = self.value(sub, f"{path}/properties/{k}", f"{hint}-{k}")
            kvs.append(self.new_rule(f"{hint}-{k}-kv", f'{gbnf.literal(json.dumps(k, ensure_ascii=False))} {ws} ":" '
                                                       f'{ws} {v} {ws}'))
        required = [k in req for k in names]
        # first[i]: properties i.. with none written yet; rest[i]: the same after one was written
        first, rest = ['""'] * (len(names) + 1), ['""'] * (len(names) + 1)
        for i in range(len(names) - 1, -1, -1):
            if required[i]:
                r = f'"," {ws} {kvs[i]} {rest[i + 1]}'
                f = f"{kvs[i]} {rest[i + 1]}"
            else:
                r = f'("," {ws} {kvs[i]})? {rest[i + 1]}'
                f = f"({kvs[i]} {rest[i + 1]} | {first[i + 1]})"
            rest[i] = self.new_rule(f"{hint}-rest{i}", r) if i else r
            first[i] = self.new_rule(f"{hint}-first{i}", f) if i else f
        return self.new_rule(hint or "object", f'"{{" {ws} {first[0]} "}}"')

    def map(self, vs, path, hint):
        ws, key = self.prim("ws"), self.prim("string")
        v = self.value(vs, f"{path}/additionalProperties", f"{hint}-value")
        kv = self.new_rule(f"{hint}-kv", f'{key} {ws} ":" {ws} {v} {ws}')
        return self.new_rule(hint or "map", f'"{{" {ws} ({kv} ("," {ws} {kv})*)? "}}"')

    def count(self, s, key, path):
        v = s.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            self.fail(key, path, "must be a non-negative integer")
        if v > MAX_REPEAT:
            self.fail(key, path, f"at most {MAX_REPEAT} is supported")
        return v

    def arr(self, s, path, hint):
        lo, hi = self.count(s, "minItems", path) or 0, self.count(s, "maxItems", path)
        if hi is not None and hi < lo:
            self.fail("maxItems", path, "is below minItems; no output can satisfy it")
        ws = self.prim("ws")
        if hi == 0:
            return f'"[" {ws} "]"'
        items = s.get("items", True)
        if isinstance(items, list):
            self.fail("items", path, "a list of item schemas (tuple validation) is not supported; give one schema")
        item = self.value(items, f"{path}/items", f"{hint}-item")
        more = f'("," {ws} {item} {ws})'
        tail_lo = max(lo - 1, 0)
        rep = f"{{{tail_lo},}}" if hi is None else f"{{{tail_lo},{hi - 1}}}"
        body = f"{item} {ws} {more}{rep}"
        if lo == 0:
            body = f"({body})?"
        return self.new_rule(hint or "array", f'"[" {ws} {body} "]"')

    def string(self, s, path, hint):
        lo, hi = self.count(s, "minLength", path) or 0, self.count(s, "maxLength", path)
        if hi is not None and hi < lo:
            self.fail("maxLength", path, "is below minLength; no output can satisfy it")
        fmt = s.get("format")
        pat = s.get("pattern")
        if fmt in FORMATS or pat is not None:
            if "minLength" in s or "maxLength" in s:
                self.fail("minLength" if "minLength" in s else "maxLength", path,
                          "cannot be combined with 'pattern' or 'format'")
            if fmt in FORMATS and pat is not None:
                self.fail("pattern", path, f"cannot be combined with format {fmt!r}")
            if fmt in FORMATS:
                return self.new_rule(hint or "string", f'"\\"" {FORMATS[fmt]} "\\""')
            if not isinstance(pat, str):
                self.fail("pattern", path, "must be a string")
            try:
                body = pattern_to_gbnf(pat, self.prim("char"))
            except PatternError as e:
                self.fail("pattern", path, str(e))
            return self.new_rule(hint or "string", f'"\\"" {body} "\\""')
        if lo == 0 and hi is None:
            return self.prim("string")
        rep = f"{{{lo},}}" if hi is None else f"{{{lo},{hi}}}"
        return self.new_rule(hint or "string", f'"\\"" {self.prim("char")}{rep} "\\""')


def _kind(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(v), "object")


def _key(v):
    return json.dumps(v, sort_keys=True)


def _is_type(v, t):
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, {"string": str, "array": list, "object": dict}[t])


def schema_to_gbnf(schema, prefix=""):
    """(rules_text, root_rule_name): GBNF rules for one JSON value valid under `schema`, every
    rule name starting with `prefix` (so several schemas can share one grammar). The value has
    no surrounding whitespace. Raises SchemaError for keywords outside the subset, and
    schema_limits.SchemaLimit for a schema too deep or too large."""
    schema_limits.check(schema)
    c = _Compiler(schema, prefix)
    expr = c.value(schema, "", "root-value" if not prefix else "value")
    name = expr if expr in c.rules else c.new_rule("value", expr)
    text = "".join(f"{n} ::= {b}\n" for n, b in c.rules.items())
    return text, name


def json_object_gbnf(prefix=""):
    """(rules_text, root_rule_name) for any JSON object (response_format json_object)."""
    return schema_to_gbnf({"type": "object"}, prefix)


def schema_grammar(schema, before="", after=""):
    """A whole grammar: `before`, one value valid under `schema`, `after`."""
    rules, name = schema_to_gbnf(schema)
    return gbnf.wrap(rules, name, before, after)
