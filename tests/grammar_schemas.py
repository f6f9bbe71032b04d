"""Random JSON Schemas inside colibri's constrained-decoding subset, and random instances valid
under them, for the grammar tests (seeded: the same seed gives the same schema)."""
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORDS = ["a", "id", "name", "x y", "é", "quote\"d", "k-1", "Ω", "tab\t"]
CHARS = "abcXYZ09 _-\"\\/\n\té€😀"


def random_schema(rng, depth=0, defs=None):
    """A schema of the supported subset; `defs` collects $defs the schema may $ref."""
    leaf = ["string", "string_len", "integer", "integer_min", "number", "boolean", "null", "enum", "const",
            "pattern", "format"]
    nodes = ["object", "object", "array", "anyOf", "oneOf", "type_list"] + (["ref"] if defs is not None else [])
    kind = rng.choice(leaf + (nodes if depth < 3 else []))
    if kind == "string":
        return {"type": "string"}
    if kind == "string_len":
        lo = rng.randint(0, 3)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(0, 6)}
    if kind == "integer":
        return {"type": "integer"}
    if kind == "integer_min":
        s = {"type": "integer", "minimum": rng.choice([-120, -3, 0, 1, 7, 95])}
        if rng.random() < 0.6:
            s["maximum"] = s["minimum"] + rng.choice([0, 5, 99, 1234])
        return s
    if kind in ("number", "boolean", "null"):
        return {"type": kind, "description": "an annotation"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", 3, None, True, 2.5, "a\"b", {"k": [1]}], rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["fixed", 7, False, ["x", 1]])}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)[0]}
    if kind == "format":
        return {"type": "string", "format": rng.choice(["date", "time", "date-time", "uuid"])}
    if kind == "object":
        names = rng.sample(WORDS, rng.randint(0, 4))
        props = {n: random_schema(rng, depth + 1, defs) for n in names}
        req = [n for n in names if rng.random() < 0.6]
        s = {"type": "object", "properties": props, "required": req}
        if rng.random() < 0.7:
            s["additionalProperties"] = False
        return s
    if kind == "array":
        s = {"type": "array", "items": random_schema(rng, depth + 1, defs)}
        lo = rng.randint(0, 2)
        if rng.random() < 0.7:
            s["minItems"] = lo
        if rng.random() < 0.7:
            s["maxItems"] = lo + rng.randint(0, 3)
        return s
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1, defs) for _ in range(rng.randint(1, 3))]}
    if kind == "oneOf":  # branches told apart by type, or objects by a discriminator
        tags = rng.sample(["cat", "dog", "eel"], rng.randint(1, 3))
        branches = [{"type": "object", "properties": {"kind": {"const": t}, "n": random_schema(rng, depth + 1, defs)},
                     "required": ["kind"], "additionalProperties": False} for t in tags]
        branches += rng.sample([{"type": "string", "maxLength": 4}, {"type": "integer"}, {"type": "null"},
                                {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}], rng.randint(0, 3))
        return {"oneOf": rng.sample(branches, len(branches))}
    if kind == "type_list":
        return {"type": rng.sample(["string", "integer", "boolean", "null"], rng.randint(1, 3))}
    name = f"D{len(defs)}"
    defs[name] = True  # reserved: a $ref inside takes the next name
    defs[name] = random_schema(rng, depth + 1, defs)
    return {"$ref": f"#/$defs/{name}"}


def random_root(rng):
    defs = {}
    s = random_schema(rng, 0, defs)
    if defs:
        s = {"allOf": [s], "$defs": defs} if "$ref" in s else {**s, "$defs": defs}
    return s


# (pattern, strings it matches (search semantics), strings it does not)
PATTERNS = [
    ("^[a-z]+\\d{2}$", ["ab12", "z00"], ["ab1", "AB12", "ab123"]),
    ("^(foo|ba[rz])+$", ["foo", "barbaz"], ["fo", "bax"]),
    ("^\\w+@\\w+\\.com$", ["me@x.com"], ["me@x.org", "@x.com"]),
    ("^[^\"]{1,3}$", ["abc", "é"], ["", "abcd", "a\"b"]),
    ("x\\.y", ["x.y", "aax.ybb"], ["xzy"]),
    ("^(?:\\+|-)?[0-9]{3}(-[0-9]{2})?$", ["+123", "123-45"], ["12", "123-4"]),
    ("^a.c$", ["abc", "a\"c", "a\\c"], ["a\nc", "ac"]),
    ("^[\\s\\S]?$", ["", " ", "\n"], ["ab"]),
]


def random_instance(rng, s, root):
    """A value valid under schema s (root: the document, for $ref)."""
    if s is True or s == {}:
        return rng.choice([1, "x", None, [], {}])
    if "$ref" in s:
        return random_instance(rng, root["$defs"][s["$ref"].split("/")[-1]], root)
    if "allOf" in s:
        return random_instance(rng, s["allOf"][0], root)
    for comb in ("anyOf", "oneOf"):
        if comb in s:
            if comb == "oneOf":  # an instance valid under exactly one branch
                for sub in rng.sample(s[comb], len(s[comb])):
                    v = random_instance(rng, sub, root)
                    if sum(valid(v, o, root) for o in s[comb]) == 1:
                        return v
                raise NoInstance()
            return random_instance(rng, rng.choice(s[comb]), root)
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return rng.choice(s["enum"])
    t = s["type"]
    if isinstance(t, list):
        t = rng.choice(t)
    if t == "object":
        props, req = s.get("properties", {}), s.get("required", [])
        return {k: random_instance(rng, v, root) for k, v in props.items() if k in req or rng.random() < 0.5}
    if t == "array":
        lo = s.get("minItems", 0)
        hi = s.get("maxItems", lo + 3)
        return [random_instance(rng, s["items"], root) for _ in range(rng.randint(lo, hi))]
    if t == "string":
        if "pattern" in s:
            return rng.choice(next(p for p in PATTERNS if p[0] == s["pattern"])[1])
        if "format" in s:
            return {"date": "2024-02-29", "time": "23:59:59Z", "date-time": "2024-01-01T00:00:00.5+01:00",
                    "uuid": "123e4567-e89b-12d3-a456-426614174000"}[s["format"]]
        lo = s.get("minLength", 0)
        return "".join(rng.choice(CHARS) for _ in range(rng.randint(lo, s.get("maxLength", lo + 5))))
    if t == "integer":
        if "minimum" in s:
            return rng.randint(s["minimum"], s.get("maximum", s["minimum"] + 10 ** 15))
        return rng.choice([0, -7, 42, 10 ** 15, -(10 ** 15)])
    if t == "number":
        return rng.choice([0, -1.5, 3.25, 1e-05, 6.02e23, 12])
    if t == "boolean":
        return rng.choice([True, False])
    return None


class NoInstance(Exception):
    pass


def valid(v, s, root):
    import jsonschema
    try:
        jsonschema.validate(v, {**s, "$defs": root.get("$defs", {})} if isinstance(s, dict) else s)
        return True
    except jsonschema.ValidationError:
        return False


def grammar_check(grammar_text, texts, tmp_path):
    """`colibri grammar-check` over texts: one of complete / prefix / reject N each."""
    g = Path(tmp_path) / "g.gbnf"
    g.write_text(grammar_text)
    data = b"\0".join(t.encode() for t in texts)
    r = subprocess.run([str(ROOT / "build" / "colibri"), "grammar-check", str(g)], input=data, capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode().splitlines()


def dumps_styles(v):
    """The same value as compact, spaced and indented JSON text (characters unescaped: the
    grammar spells property names as written, so "\\u00e9" for a key "é" is not taken)."""
    return [json.dumps(v, ensure_ascii=False, separators=(",", ":")), json.dumps(v, ensure_ascii=False),
            json.dumps(v, indent=2, ensure_ascii=False)]
