"""Runtime of colibri's chat-template interpreter (see chat_template.py).

What a rendered jinja2 template sees at run time, with the semantics of jinja2 3.1 in the
ImmutableSandboxedEnvironment that transformers builds: Undefined, Markup, namespace(),
the loop variable, macros, sandboxed attribute/item access, the filters, tests and
globals, and the Renderer that walks the tuple AST of syntax.py.
"""

import json
import math
import re
import string
import _string  # CPython's format-field splitter, used by the sandboxed str.format
from collections import abc
from datetime import datetime
from numbers import Number

MAX_RANGE = 100000  # jinja2.sandbox.MAX_RANGE: range() larger than this is refused


class TemplateError(Exception):
    """A template could not be parsed or rendered (also what raise_exception() raises)."""

    def __init__(self, message, lineno=None):
        self.message = message
        self.lineno = lineno
        super().__init__(message if lineno is None else f"line {lineno}: {message}")


# Bounds. jinja2's sandbox blocks unsafe attribute access but not a template that runs forever
# or builds gigabytes ('x' * 10**10, nested loops, 9 ** 10**9, '{:999999999}'.format(1)). A
# chat template only builds a prompt, so one render may build at most MAX_LENGTH characters
# (or items) in one value and in all its output together (16M characters is at most 64 MiB of
# UTF-8, the engine's largest prompt), and may run at most MAX_STEPS loop iterations and macro
# calls. Anything larger is refused before it is built.
MAX_LENGTH = 1 << 24
MAX_STEPS = 1_000_000
MAX_POW_BITS = 1 << 16


def _too_big(what, n):
    raise TemplateError(f"the template would build {what} of {n} characters or items; a chat "
                        f"template may build at most {MAX_LENGTH}")


def _weight(value):
    """About how many characters value takes as text, counted only until it passes
    MAX_LENGTH (a list repeated inside another counts each time, as printing it would)."""
    stack, total = [value], 0
    while stack and total <= MAX_LENGTH:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, int):
            total += abs(v).bit_length() // 3 + 2
        elif isinstance(v, abc.Mapping):
            total += 4 * len(v) + 2
            if total <= MAX_LENGTH:
                stack.extend(v.keys())
                stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            total += 2 * len(v) + 2
            if total <= MAX_LENGTH:
                stack.extend(v)
        else:
            total += 24
    return total


def _checked(value):
    """value, unless it is a string or container larger than a render may build."""
    if isinstance(value, (str, list, tuple, abc.Mapping)) and len(value) > MAX_LENGTH:
        _too_big(f"a {type_name(value)}", len(value))
    return value


def _check_width(what, n):
    if isinstance(n, int) and n > MAX_LENGTH:
        _too_big(what, n)


def _check_spec(spec):
    """Widths and precisions in a format spec ('>999999999', '.999999999f')."""
    for digits in re.findall(r"\d+", spec):
        if len(digits) > 9 or int(digits) > MAX_LENGTH:  # int() of a huge digit run is slow itself
            _too_big("a formatted field", int(digits[:20]))


def _mul(a, b):
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and n > 1:
            size = len(seq) if isinstance(seq, str) else _weight(seq)
            if size * n > MAX_LENGTH:
                _too_big(f"a {type_name(seq)}", size * n)
    return a * b


def _pow(a, b):
    if isinstance(a, int) and isinstance(b, int) and b > 0 and (abs(a).bit_length() - 1) * b > MAX_POW_BITS:
        raise TemplateError(f"{a} ** {b} is too large a number for a chat template")
    return a ** b


def _mod(a, b):
    if isinstance(a, str):  # printf-style formatting
        for spec in re.findall(r"%[-#0 +(),.\w]*", a):
            _check_spec(spec)
        for arg in b if isinstance(b, tuple) else (b,):
            if "*" in a:
                _check_width("a formatted field", arg)
    return a % b


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


# --------------------------------------------------------------------------------------
# Runtime values that are not plain Python data
# --------------------------------------------------------------------------------------

class Undefined:
    """jinja2.Undefined: renders as '', is falsy, iterates empty, errors on everything else."""

    __slots__ = ("_hint",)

    def __init__(self, hint="value is undefined"):
        self._hint = hint

    def _fail(self, *args, **kwargs):
        raise TemplateError(self._hint)

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _fail
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _fail
    __mod__ = __rmod__ = __pos__ = __neg__ = __pow__ = __rpow__ = _fail
    __call__ = __getitem__ = __lt__ = __le__ = __gt__ = __ge__ = _fail
    __int__ = __float__ = __complex__ = _fail

    def __eq__(self, other):
        return type(self) is type(other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return id(type(self))

    def __str__(self):
        return ""

    def __len__(self):
        return 0

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __repr__(self):
        return "Undefined"


class Namespace:
    """namespace(): the one object a template may mutate (`{% set ns.x = ... %}`)."""

    def __init__(self, *args, **kwargs):
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        self.attrs = attrs

    def __repr__(self):
        return f"<Namespace {self.attrs!r}>"


def _check_namespace_name(name):
    # transformers' TemplateNamespace refuses underscore names (sandbox hardening)
    if isinstance(name, str) and name.startswith("_"):
        raise TemplateError(f"Chat templates cannot store underscore-prefixed attributes "
                            f"on a namespace, but got {name!r}.")


def _escape_html(value):
    """markupsafe.escape: & < > ' " become entities, unless the value is already Markup."""
    if isinstance(value, _Markup):
        return value
    text = value if type(value) is str else str(value)
    return _Markup(text.replace("&", "&amp;").replace(">", "&gt;").replace("<", "&lt;")
                   .replace("'", "&#39;").replace('"', "&#34;"))


class _Markup(str):
    """markupsafe.Markup, what |safe and |escape return. Even with autoescape off it escapes
    the plain strings combined with it (`x|safe + '<b>'`), and string methods keep it Markup,
    so templates that rely on that render the same. `%` and format() are refused."""

    def __add__(self, other):
        if isinstance(other, str):
            return _Markup(str.__add__(self, _escape_html(other)))
        return NotImplemented

    def __radd__(self, other):
        if isinstance(other, str):
            return _Markup(str.__add__(_escape_html(other), self))
        return NotImplemented

    def __mul__(self, n):
        return _Markup(str.__mul__(self, n))

    __rmul__ = __mul__

    def __getitem__(self, key):
        return _Markup(str.__getitem__(self, key))

    def __mod__(self, value):
        raise TemplateError("the % operator on a |safe or |escape result is not supported")

    format = format_map = __mod__

    def join(self, iterable):
        return _Markup(str.join(self, map(_escape_html, iterable)))

    def replace(self, old, new, count=-1):
        return _Markup(str.replace(self, old, _escape_html(new), count))

    def center(self, width, fillchar=" "):
        return _Markup(str.center(self, width, _escape_html(fillchar)))

    def ljust(self, width, fillchar=" "):
        return _Markup(str.ljust(self, width, _escape_html(fillchar)))

    def rjust(self, width, fillchar=" "):
        return _Markup(str.rjust(self, width, _escape_html(fillchar)))

    def split(self, sep=None, maxsplit=-1):
        return [_Markup(v) for v in str.split(self, sep, maxsplit)]

    def rsplit(self, sep=None, maxsplit=-1):
        return [_Markup(v) for v in str.rsplit(self, sep, maxsplit)]

    def splitlines(self, keepends=False):
        return [_Markup(v) for v in str.splitlines(self, keepends)]

    def partition(self, sep):
        return tuple(_Markup(v) for v in str.partition(self, sep))

    def rpartition(self, sep):
        return tuple(_Markup(v) for v in str.rpartition(self, sep))

    def __repr__(self):
        return f"Markup({str.__repr__(self)})"


def _markup_method(name):
    method = getattr(str, name)
    return lambda self, *args: _Markup(method(self, *args))


for _name in ("capitalize", "title", "lower", "upper", "lstrip", "rstrip", "strip",
              "expandtabs", "swapcase", "zfill", "casefold", "removeprefix", "removesuffix",
              "translate"):
    setattr(_Markup, _name, _markup_method(_name))


class _DictGlobal:
    """transformers' `dict` global: callable, plus dict.fromkeys."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    @staticmethod
    def fromkeys(*args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Unsupported:
    """A jinja2 global we do not implement: `is defined` stays true, calling it fails."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise TemplateError(f"the global {self.name}() is not supported by colibri's "
                            f"chat-template renderer")


class _Loop:
    """The `loop` variable of a for statement (jinja2.runtime.LoopContext)."""

    ATTRS = frozenset(["index", "index0", "revindex", "revindex0", "first", "last",
                       "length", "depth", "depth0", "previtem", "nextitem", "cycle",
                       "changed"])

    def __init__(self, items):
        self.items = items
        self.length = len(items)
        self.index0 = -1
        self.depth0 = 0
        self.depth = 1
        self._last_changed = object()

    def get(self, name):
        i, n = self.index0, self.length
        if name == "index":
            return i + 1
        if name == "index0":
            return i
        if name == "revindex":
            return n - i
        if name == "revindex0":
            return n - i - 1
        if name == "first":
            return i == 0
        if name == "last":
            return i == n - 1
        if name == "previtem":
            return self.items[i - 1] if i > 0 else Undefined("there is no previous item")
        if name == "nextitem":
            return self.items[i + 1] if i + 1 < n else Undefined("there is no next item")
        if name == "cycle":
            return self.cycle
        if name == "changed":
            return self.changed
        return getattr(self, name)  # length, depth, depth0

    def cycle(self, *args):
        if not args:
            raise TemplateError("no items for cycling given")
        return args[self.index0 % len(args)]

    def changed(self, *value):
        if value != self._last_changed:
            self._last_changed = value
            return True
        return False

    def __repr__(self):
        return f"<LoopContext {self.index0 + 1}/{self.length}>"


class _Macro:
    """A {% macro %} (or the `caller` of a {% call %} block), bound to its defining scope."""

    def __init__(self, renderer, name, params, defaults, body, scope, flags):
        self.renderer, self.name, self.params = renderer, name, params
        self.defaults, self.body, self.scope = defaults, body, scope
        self.catch_varargs, self.catch_kwargs, self.caller = flags

    def __call__(self, *args, **kwargs):
        # mirrors jinja2.runtime.Macro.__call__ argument binding
        n = len(self.params)
        values = list(args[:n]) + [kwargs.pop(name, _MISSING) for name in self.params[len(args):]]
        scope = Scope(self.scope)
        if self.caller:
            scope.set("caller", kwargs.pop("caller", Undefined("No caller defined")))
        if self.catch_kwargs:
            scope.set("kwargs", kwargs)
        elif kwargs:
            raise TemplateError(f"macro {self.name!r} takes no keyword argument "
                                f"{next(iter(kwargs))!r}")
        if self.catch_varargs:
            scope.set("varargs", tuple(args[n:]))
        elif len(args) > n:
            raise TemplateError(f"macro {self.name!r} takes not more than {n} argument(s)")
        for name, value in zip(self.params, values):
            if value is _MISSING:
                default = self.defaults.get(name)
                value = (self.renderer.eval(default, scope) if default is not None
                         else Undefined(f"parameter {name!r} was not provided"))
            scope.set(name, value)
        self.renderer.step()
        out = []
        self.renderer.exec_body(self.body, scope, out)
        return "".join(out)

    def __repr__(self):
        return f"<Macro {self.name!r}>"


_MISSING = object()


class Scope:
    """One jinja2 frame: a for-loop iteration, macro call, with/filter/set block, or the
    template itself. Assignments stay in the frame that made them."""

    __slots__ = ("vars", "parent")

    def __init__(self, parent=None, variables=None):
        self.parent = parent
        self.vars = {} if variables is None else variables

    def lookup(self, name):
        scope = self
        while scope is not None:
            if name in scope.vars:
                return scope.vars[name]
            scope = scope.parent
        return _GLOBALS.get(name, _MISSING)

    def set(self, name, value):
        self.vars[name] = value


# --------------------------------------------------------------------------------------
# Attribute and item access (jinja2.sandbox.ImmutableSandboxedEnvironment rules)
# --------------------------------------------------------------------------------------

# Methods of plain data that templates may call. Methods that mutate are refused, like the
# immutable sandbox does; other existing attributes (int.real, ...) are refused as unsupported
# rather than silently turned into Undefined.
_SAFE_METHODS = {
    str: frozenset(n for n in dir(str) if not n.startswith("_")) - {"format_map"},
    dict: frozenset(["items", "keys", "values", "get", "copy"]),
    list: frozenset(["count", "index", "copy"]),
    tuple: frozenset(["count", "index"]),
}
_MUTATING = frozenset(["append", "extend", "insert", "pop", "remove", "reverse", "sort",
                       "clear", "update", "setdefault", "popitem"])


def type_name(obj):
    return "none" if obj is None else type(obj).__name__


def _python_attr(obj, name):
    """jinja2 tries getattr(obj, name) first; return _MISSING when it would fail."""
    if isinstance(obj, Namespace):
        return obj.attrs.get(name, _MISSING)
    if isinstance(obj, _Loop):
        return obj.get(name) if name in _Loop.ATTRS else _MISSING
    if isinstance(obj, _DictGlobal):
        return obj.fromkeys if name == "fromkeys" else _MISSING
    if isinstance(obj, _Macro):
        if name in ("name", "arguments"):
            return obj.name if name == "name" else tuple(obj.params)
        return _MISSING
    if not hasattr(obj, name):
        return _MISSING
    if name.startswith("_"):
        raise TemplateError(f"access to attribute {name!r} of {type_name(obj)!r} object "
                            f"is unsafe")
    for base, allowed in _SAFE_METHODS.items():
        if isinstance(obj, base):
            if name in allowed:
                if base is str and name == "format" and not isinstance(obj, _Markup):
                    return lambda *a, **k: _FORMATTER.vformat(obj, a, k)
                return getattr(obj, name)
            if name in _MUTATING:
                raise TemplateError(f"{type_name(obj)}.{name}() modifies data and is not "
                                    f"allowed in a chat template")
            break
    raise TemplateError(f"attribute {name!r} of {type_name(obj)!r} objects is not "
                        f"supported by colibri's chat-template renderer")


def get_attr(obj, name):
    """`obj.name`: attribute first, then item, else Undefined."""
    if isinstance(obj, Undefined):
        obj._fail()
    value = _python_attr(obj, name)
    if value is not _MISSING:
        return value
    try:
        return obj[name]
    except (TypeError, LookupError):
        return Undefined(f"{type_name(obj)!r} object has no attribute {name!r}")


def get_item(obj, key):
    """`obj[key]`: item first, then (for string keys) attribute, else Undefined."""
    if isinstance(obj, Undefined):
        obj._fail()
    try:
        return obj[key]
    except (TypeError, LookupError):
        if isinstance(key, str):
            value = _python_attr(obj, key)
            if value is not _MISSING:
                return value
        return Undefined(f"{type_name(obj)!r} object has no element {key!r}")


class _SandboxedFormatter(string.Formatter):
    """str.format whose field lookups ({0.attr}, {0[key]}) go through the sandbox rules."""

    def get_field(self, field_name, args, kwargs):
        first, rest = _string.formatter_field_name_split(field_name)
        obj = self.get_value(first, args, kwargs)
        for is_attr, part in rest:
            obj = get_attr(obj, part) if is_attr else get_item(obj, part)
        return obj, first

    def format_field(self, value, format_spec):
        _check_spec(format_spec)
        return _checked(super().format_field(value, format_spec))


_FORMATTER = _SandboxedFormatter()


def to_str(value):
    """How jinja2 turns a value into output text (str(), with Undefined as '')."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, Undefined):
        return ""
    if callable(value) or isinstance(value, abc.Iterator):
        # jinja2 would print a repr with a memory address: never meaningful in a prompt
        raise TemplateError(f"cannot render a {type_name(value)} object as text")
    if isinstance(value, (list, tuple, abc.Mapping)) and _weight(value) > MAX_LENGTH:
        _too_big(f"the text of a {type_name(value)}", _weight(value))
    return str(value)


# --------------------------------------------------------------------------------------
# Filters and tests (jinja2.filters / jinja2.tests, plus transformers' tojson)
# --------------------------------------------------------------------------------------

def _soft_str(value):
    return value if isinstance(value, str) else to_str(value) if isinstance(value, (list, tuple, abc.Mapping)) else str(value)


def _attr_parts(attribute):
    if attribute is None:
        return []
    if isinstance(attribute, str):
        return [int(x) if x.isdigit() else x for x in attribute.split(".")]
    return [attribute]


def _attrgetter(attribute, postprocess=None, default=None):
    parts = _attr_parts(attribute)

    def getter(item):
        for part in parts:
            item = get_item(item, part)
            if default is not None and isinstance(item, Undefined):
                item = default
        return postprocess(item) if postprocess is not None else item
    return getter


def _ignore_case(value):
    return value.lower() if isinstance(value, str) else value


def f_tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers overrides jinja2's HTML-safe tojson with plain json.dumps
    if _weight(x) * (1 + (indent if isinstance(indent, int) else len(indent or ""))) > MAX_LENGTH:
        _too_big("JSON text", _weight(x))
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def f_default(value, default_value="", boolean=False):
    if isinstance(value, Undefined) or (boolean and not value):
        return default_value
    return value


def f_join(value, d="", attribute=None):
    if attribute is not None:
        value = map(_attrgetter(attribute), value)
    parts = [to_str(v) for v in value]
    if sum(map(len, parts)) + len(str(d)) * len(parts) > MAX_LENGTH:
        _too_big("a joined string", sum(map(len, parts)) + len(str(d)) * len(parts))
    return str(d).join(parts)


def f_first(seq):
    try:
        return next(iter(seq))
    except StopIteration:
        return Undefined("No first item, sequence was empty.")


def f_last(seq):
    try:
        return next(iter(reversed(seq)))
    except StopIteration:
        return Undefined("No last item, sequence was empty.")


def f_items(value):
    if isinstance(value, Undefined):
        return iter(())
    if not isinstance(value, abc.Mapping):
        raise TemplateError("Can only get item pairs from a mapping.")
    return iter(value.items())


def f_indent(s, width=4, first=False, blank=False):
    _check_width("an indent", len(width) if isinstance(width, str) else width)
    if (len(width) if isinstance(width, str) else width) * (str(s).count("\n") + 1) > MAX_LENGTH:
        _too_big("an indented string", width)
    indention = width if isinstance(width, str) else " " * width
    markup = isinstance(s, _Markup)  # jinja2 keeps Markup, with the same characters
    s = str.__str__(s) + "\n"  # jinja2's quirk so splitlines keeps a trailing empty line
    if blank:
        rv = ("\n" + indention).join(s.splitlines())
    else:
        lines = s.splitlines()
        rv = lines.pop(0)
        if lines:
            rv += "\n" + "\n".join(indention + line if line else line for line in lines)
    rv = indention + rv if first else rv
    return _Markup(rv) if markup else rv


def f_int(value, default=0, base=10):
    try:
        if isinstance(value, str):
            return int(value, base)
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return default


def f_float(value, default=0.0):
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def f_replace(s, old, new, count=None):
    s, old, new = str(s), str(old), str(new)
    if len(new) > len(old) and len(s) + s.count(old) * (len(new) - len(old)) > MAX_LENGTH:
        _too_big("a replaced string", len(s) + s.count(old) * (len(new) - len(old)))
    return s.replace(old, new, -1 if count is None else count)


def f_format(value, *args, **kwargs):
    if args and kwargs:
        raise TemplateError("can't handle positional and keyword arguments at the same time")
    return _soft_str(value) % (kwargs or args)


def f_title(s):
    return "".join(item[0].upper() + item[1:].lower()
                   for item in re.split(r"([-\s({\[<]+)", _soft_str(s)) if item)


def f_reverse(value):
    if isinstance(value, str):
        return value[::-1]
    try:
        return reversed(value)
    except TypeError:
        rv = list(value)
        rv.reverse()
        return rv


def f_round(value, precision=0, method="common"):
    if method not in ("common", "ceil", "floor"):
        raise TemplateError("method must be common, ceil or floor")
    if method == "common":
        return round(value, precision)
    return getattr(math, method)(value * (10 ** precision)) / (10 ** precision)


def f_sort(value, reverse=False, case_sensitive=False, attribute=None):
    post = None if case_sensitive else _ignore_case
    if isinstance(attribute, str) and "," in attribute:
        getters = [_attrgetter(a, post) for a in attribute.split(",")]
        return sorted(value, key=lambda item: [g(item) for g in getters], reverse=reverse)
    getter = _attrgetter(attribute, post)
    return sorted(value, key=lambda item: [getter(item)], reverse=reverse)


def f_dictsort(value, case_sensitive=False, by="key", reverse=False):
    if by not in ("key", "value"):
        raise TemplateError('You can only sort by either "key" or "value"')
    pos = 0 if by == "key" else 1

    def key(item):
        return item[pos] if case_sensitive else _ignore_case(item[pos])
    return sorted(value.items(), key=key, reverse=reverse)


def f_unique(value, case_sensitive=False, attribute=None):
    getter = _attrgetter(attribute, None if case_sensitive else _ignore_case)
    seen = set()
    for item in value:
        key = getter(item)
        if key not in seen:
            seen.add(key)
            yield item


def _min_max(func, value, case_sensitive, attribute):
    items = list(value)
    if not items:
        return Undefined("No aggregated item, sequence was empty.")
    return func(items, key=_attrgetter(attribute, None if case_sensitive else _ignore_case))


def f_min(value, case_sensitive=False, attribute=None):
    return _min_max(min, value, case_sensitive, attribute)


def f_max(value, case_sensitive=False, attribute=None):
    return _min_max(max, value, case_sensitive, attribute)


def f_sum(iterable, attribute=None, start=0):
    if attribute is not None:
        iterable = map(_attrgetter(attribute), iterable)
    return sum(iterable, start)


def f_map(value, *args, **kwargs):
    if not value:
        return
    if not args and "attribute" in kwargs:
        attribute = kwargs.pop("attribute")
        default = kwargs.pop("default", None)
        if kwargs:
            raise TemplateError(f"Unexpected keyword argument {next(iter(kwargs))!r}")
        func = _attrgetter(attribute, default=default)
    else:
        if not args:
            raise TemplateError("map requires a filter argument")
        name, fargs = args[0], args[1:]

        def func(item):
            return _call_filter(name, item, fargs, kwargs)
    for item in value:
        yield func(item)


def _select(value, args, kwargs, negate, lookup_attr):
    if not value:
        return
    off = 0
    transform = None
    if lookup_attr:
        if not args:
            raise TemplateError("Missing parameter for attribute name")
        transform = _attrgetter(args[0])
        off = 1
    if len(args) > off:
        name, targs = args[off], args[off + 1:]

        def check(item):
            return _call_test(name, item, targs, kwargs)
    else:
        check = bool
    for item in value:
        if bool(check(transform(item) if transform else item)) != negate:
            yield item


def f_select(value, *args, **kwargs):
    return _select(value, args, kwargs, False, False)


def f_reject(value, *args, **kwargs):
    return _select(value, args, kwargs, True, False)


def f_selectattr(value, *args, **kwargs):
    return _select(value, args, kwargs, False, True)


def f_rejectattr(value, *args, **kwargs):
    return _select(value, args, kwargs, True, True)


def f_attr(obj, name):
    value = _python_attr(obj, name) if not isinstance(obj, Undefined) else _MISSING
    return Undefined(f"no attribute {name!r}") if value is _MISSING else value


def f_truncate(s, length=255, killwords=False, end="...", leeway=None):
    leeway = 5 if leeway is None else leeway
    if length < len(end) or leeway < 0:
        raise TemplateError("invalid truncate arguments")
    if len(s) <= length + leeway:
        return s
    if killwords:
        return s[:length - len(end)] + end
    return s[:length - len(end)].rsplit(" ", 1)[0] + end


FILTERS = {
    "abs": abs, "attr": f_attr, "capitalize": lambda s: _soft_str(s).capitalize(),
    "center": lambda value, width=80: _check_width("a centered string", width) or _soft_str(value).center(width),
    "count": len, "length": len, "d": f_default, "default": f_default,
    "dictsort": f_dictsort, "e": _escape_html, "escape": _escape_html,
    "forceescape": lambda value: _escape_html(str(value)),
    "first": f_first, "float": f_float, "format": f_format, "indent": f_indent, "int": f_int,
    "items": f_items, "join": f_join, "last": f_last, "list": list,
    "lower": lambda s: _soft_str(s).lower(), "upper": lambda s: _soft_str(s).upper(),
    "map": f_map, "max": f_max, "min": f_min, "reject": f_reject, "rejectattr": f_rejectattr,
    "replace": f_replace, "reverse": f_reverse, "round": f_round,
    "safe": lambda value: _Markup(_soft_str(value)), "select": f_select,
    "selectattr": f_selectattr, "sort": f_sort, "string": _soft_str, "sum": f_sum,
    "title": f_title, "tojson": f_tojson,
    "trim": lambda value, chars=None: _soft_str(value).strip(chars),
    "truncate": f_truncate, "unique": f_unique,
    "wordcount": lambda s: len(re.findall(r"\w+", _soft_str(s))),
}
# Filters jinja2 has that we do not: a template using one fails when it reaches it.
JINJA_ONLY_FILTERS = frozenset(["batch", "filesizeformat", "groupby", "pprint", "random",
                                 "slice", "striptags", "urlencode", "urlize", "wordwrap",
                                 "xmlattr"])


def _test_sequence(value):
    try:
        len(value)
        value.__getitem__
    except Exception:
        return False
    return True


def _test_iterable(value):
    try:
        iter(value)
    except TypeError:
        return False
    return True


TESTS = {
    "odd": lambda v: v % 2 == 1, "even": lambda v: v % 2 == 0,
    "divisibleby": lambda v, num: v % num == 0,
    "defined": lambda v: not isinstance(v, Undefined),
    "undefined": lambda v: isinstance(v, Undefined),
    "filter": lambda v: v in FILTERS or v in JINJA_ONLY_FILTERS,
    "test": lambda v: v in TESTS,
    "none": lambda v: v is None, "boolean": lambda v: v is True or v is False,
    "false": lambda v: v is False, "true": lambda v: v is True,
    "integer": lambda v: isinstance(v, int) and v is not True and v is not False,
    "float": lambda v: isinstance(v, float),
    "lower": lambda v: str(v).islower(), "upper": lambda v: str(v).isupper(),
    "string": lambda v: isinstance(v, str), "mapping": lambda v: isinstance(v, abc.Mapping),
    "number": lambda v: isinstance(v, Number), "sequence": _test_sequence,
    "iterable": _test_iterable, "callable": callable,
    "sameas": lambda v, other: v is other, "escaped": lambda v: isinstance(v, _Markup),
    "in": lambda v, seq: v in seq,
    "==": lambda a, b: a == b, "eq": lambda a, b: a == b, "equalto": lambda a, b: a == b,
    "!=": lambda a, b: a != b, "ne": lambda a, b: a != b,
    ">": lambda a, b: a > b, "gt": lambda a, b: a > b, "greaterthan": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "ge": lambda a, b: a >= b,
    "<": lambda a, b: a < b, "lt": lambda a, b: a < b, "lessthan": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, "le": lambda a, b: a <= b,
}


def _call_filter(name, value, args, kwargs):
    func = FILTERS.get(name)
    if func is None:
        if name not in JINJA_ONLY_FILTERS:
            raise TemplateError(f"No filter named {name!r} found.")
        raise TemplateError(f"filter {name!r} is not supported by colibri's chat-template "
                            f"renderer")
    return _checked(func(value, *args, **kwargs))


def _call_test(name, value, args, kwargs):
    func = TESTS.get(name)
    if func is None:
        raise TemplateError(f"No test named {name!r} found.")
    return func(value, *args, **kwargs)


def _range(*args):
    rng = range(*args)
    if len(rng) > MAX_RANGE:
        raise TemplateError(f"Range too big. The sandbox blocks ranges larger than "
                            f"MAX_RANGE ({MAX_RANGE}).")
    return rng


def _raise_exception(message):
    raise TemplateError(message)


def _strftime_now(format):
    return datetime.now().strftime(format)


_GLOBALS = {
    "range": _range, "dict": _DictGlobal(), "namespace": Namespace,
    "raise_exception": _raise_exception, "strftime_now": _strftime_now,
    "lipsum": _Unsupported("lipsum"), "cycler": _Unsupported("cycler"),
    "joiner": _Unsupported("joiner"),
}


# --------------------------------------------------------------------------------------
# Renderer
# --------------------------------------------------------------------------------------

_BINOPS = {
    "+": lambda a, b: _checked(a + b), "-": lambda a, b: a - b, "*": _mul,
    "/": lambda a, b: a / b, "//": lambda a, b: a // b, "%": _mod,
    "**": _pow,
}
_CMPOPS = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
}


def _located(error, lineno):
    """The TemplateError to raise for `error` met while running the node at `lineno`."""
    if isinstance(error, TemplateError):
        return error if error.lineno is not None else TemplateError(error.message, lineno)
    if isinstance(error, RecursionError):
        return TemplateError("template recursion too deep", lineno)
    # a Python error inside an expression (e.g. 'a' + 1): jinja2 fails there too
    return TemplateError(f"{type(error).__name__}: {error}", lineno)


class Renderer:
    """Runs statement nodes (_s_*), appending text to `out`, and evaluates expression nodes
    (_e_*) in a Scope."""

    steps = produced = 0  # work done by this render: see MAX_STEPS and MAX_LENGTH

    def step(self):
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateError(f"the template ran more than {MAX_STEPS} loop iterations and "
                                f"macro calls; a chat template never needs that many")

    def emit(self, out, text):
        self.produced += len(text)
        if self.produced > MAX_LENGTH:
            _too_big("output", self.produced)
        out.append(text)

    def exec_body(self, body, scope, out):
        for node in body:
            try:
                getattr(self, "_s_" + node[0])(node, scope, out)
            except (_Break, _Continue):
                raise
            except Exception as e:
                raise _located(e, node[1]) from None

    # ---- statements
    def _s_output(self, node, scope, out):
        for item in node[2]:
            if isinstance(item, str):
                self.emit(out, item)
                continue
            try:  # one output node spans several lines; report the expression's own
                self.emit(out, to_str(self.eval(item, scope)))
            except Exception as e:
                raise _located(e, item[1]) from None

    def _s_if(self, node, scope, out):
        for test, body in node[2]:
            if self.eval(test, scope):
                return self.exec_body(body, scope, out)
        self.exec_body(node[3], scope, out)

    def _s_for(self, node, scope, out):
        _, _, target, iter_node, test, body, else_ = node
        items = list(self.eval(iter_node, scope))  # dicts iterate keys, Undefined nothing
        if test is not None:  # `for x in xs if cond`: loop.* counts only kept items
            kept = []
            for item in items:
                self.step()
                probe = Scope(scope)
                self.assign(target, item, probe)
                if self.eval(test, probe):
                    kept.append(item)
            items = kept
        loop = _Loop(items)
        for item in items:
            self.step()
            loop.index0 += 1
            inner = Scope(scope)  # jinja2 gives every iteration a fresh frame
            self.assign(target, item, inner)
            inner.set("loop", loop)
            try:
                self.exec_body(body, inner, out)
            except _Break:
                break
            except _Continue:
                continue
        if not items:
            self.exec_body(else_, Scope(scope), out)

    def _s_set(self, node, scope, out):
        self.assign(node[2], self.eval(node[3], scope), scope)

    def _s_setblock(self, node, scope, out):
        _, _, target, filt, body = node
        buf = []
        self.exec_body(body, Scope(scope), buf)
        value = "".join(buf)
        if filt is not None:
            value = self.apply_filter(filt, value, scope)
        self.assign(target, value, scope)

    def _s_macro(self, node, scope, out):
        _, _, name, params, defaults, body, flags = node
        scope.set(name, _Macro(self, name, params, defaults, body, scope, flags))

    def _s_callblock(self, node, scope, out):
        _, lineno, call, params, defaults, body, flags = node
        caller = _Macro(self, "caller", params, defaults, body, scope, flags)
        self.emit(out, to_str(self.eval_call(call, scope, extra_kwargs={"caller": caller})))

    def _s_filterblock(self, node, scope, out):
        buf = []
        self.exec_body(node[3], Scope(scope), buf)
        self.emit(out, to_str(self.apply_filter(node[2], "".join(buf), scope)))

    def _s_with(self, node, scope, out):
        _, _, targets, values, body = node
        inner = Scope(scope)
        for target, value in zip(targets, [self.eval(v, scope) for v in values]):
            self.assign(target, value, inner)
        self.exec_body(body, inner, out)

    def _s_scope(self, node, scope, out):
        self.exec_body(node[2], Scope(scope), out)  # jinja2 renders it as a call block

    def _s_break(self, node, scope, out):
        raise _Break()

    def _s_continue(self, node, scope, out):
        raise _Continue()

    def assign(self, target, value, scope):
        kind = target[0]
        if kind == "name":
            scope.set(target[2], value)
        elif kind == "nsref":
            ns = scope.lookup(target[2])
            if not isinstance(ns, Namespace):
                raise TemplateError("cannot assign attribute on non-namespace object",
                                    target[1])
            _check_namespace_name(target[3])
            ns.attrs[target[3]] = value
        else:  # tuple unpacking, Python's rules
            names = target[2]
            values = list(value)
            if len(values) != len(names):
                raise TemplateError(f"cannot unpack {len(values)} values into "
                                    f"{len(names)} names", target[1])
            for sub, item in zip(names, values):
                self.assign(sub, item, scope)

    # ---- expressions
    def eval(self, node, scope):
        return getattr(self, "_e_" + node[0])(node, scope)

    def _e_const(self, node, scope):
        return node[2]

    def _e_name(self, node, scope):
        value = scope.lookup(node[2])
        return Undefined(f"{node[2]!r} is undefined") if value is _MISSING else value

    def _e_list(self, node, scope):
        return [self.eval(item, scope) for item in node[2]]

    def _e_tuple(self, node, scope):
        return tuple(self.eval(item, scope) for item in node[2])

    def _e_dict(self, node, scope):
        return {self.eval(k, scope): self.eval(v, scope) for k, v in node[2]}

    def _e_getattr(self, node, scope):
        return get_attr(self.eval(node[2], scope), node[3])

    def _e_getitem(self, node, scope):
        obj = self.eval(node[2], scope)
        key_node = node[3]
        if key_node[0] == "slice":
            key = slice(*(None if part is None else self.eval(part, scope)
                          for part in key_node[2:]))
        else:
            key = self.eval(key_node, scope)
        return get_item(obj, key)

    def _e_slice(self, node, scope):
        raise TemplateError("slice outside of a subscript", node[1])

    def _e_not(self, node, scope):
        return not self.eval(node[2], scope)

    def _e_neg(self, node, scope):
        return -self.eval(node[2], scope)

    def _e_pos(self, node, scope):
        return +self.eval(node[2], scope)

    def _e_and(self, node, scope):
        return self.eval(node[2], scope) and self.eval(node[3], scope)

    def _e_or(self, node, scope):
        return self.eval(node[2], scope) or self.eval(node[3], scope)

    def _e_binop(self, node, scope):
        return _BINOPS[node[2]](self.eval(node[3], scope), self.eval(node[4], scope))

    def _e_concat(self, node, scope):
        return _checked("".join(to_str(self.eval(item, scope)) for item in node[2]))

    def _e_compare(self, node, scope):
        left = self.eval(node[2], scope)
        for op, right_node in node[3]:  # chained like Python: a < b < c
            right = self.eval(right_node, scope)
            if not _CMPOPS[op](left, right):
                return False
            left = right
        return True

    def _e_condexpr(self, node, scope):
        if self.eval(node[2], scope):
            return self.eval(node[3], scope)
        if node[4] is None:
            return Undefined("the inline if-expression evaluated to false and defined "
                             "no else section")
        return self.eval(node[4], scope)

    def _e_nsref(self, node, scope):
        raise TemplateError("namespace reference outside of an assignment", node[1])

    def _args(self, node, scope, extra_kwargs=None):
        """Positional and keyword arguments of a call/filter/test node (fields 4 onward
        of a filter, 3 onward of a call)."""
        args_nodes, kwargs_nodes, dyn_args, dyn_kwargs = node
        args = [self.eval(a, scope) for a in args_nodes]
        kwargs = {k: self.eval(v, scope) for k, v in kwargs_nodes}
        if dyn_args is not None:
            args.extend(self.eval(dyn_args, scope))
        if dyn_kwargs is not None:
            kwargs.update(self.eval(dyn_kwargs, scope))
        if extra_kwargs:
            kwargs.update(extra_kwargs)
        return args, kwargs

    def _e_call(self, node, scope):
        return self.eval_call(node, scope)

    def eval_call(self, node, scope, extra_kwargs=None):
        func = self.eval(node[2], scope)
        args, kwargs = self._args(node[3:7], scope, extra_kwargs)
        if isinstance(func, Undefined):
            func._fail()
        if not callable(func):
            raise TemplateError(f"{type_name(func)!r} object is not callable", node[1])
        return _checked(func(*args, **kwargs))

    def apply_filter(self, node, value, scope):
        args, kwargs = self._args(node[4:8], scope)
        try:
            return _call_filter(node[3], value, args, kwargs)
        except Exception as e:
            raise _located(e, node[1]) from None

    def _e_filter(self, node, scope):
        return self.apply_filter(node, self.eval(node[2], scope), scope)

    def _e_test(self, node, scope):
        value = self.eval(node[2], scope)
        args, kwargs = self._args(node[4:8], scope)
        return _call_test(node[3], value, args, kwargs)
