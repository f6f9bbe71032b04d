"""Lexer and parser of colibri's chat-template interpreter (see chat_template.py).

They follow jinja2's lexer.py and parser.py with transformers' settings (trim_blocks,
lstrip_blocks, loop controls, the {% generation %} tag), so whitespace control, operator
precedence and the error cases match jinja2's; the output is a small tuple AST.
"""

import re

from colibri.chat_template.runtime import FILTERS, JINJA_ONLY_FILTERS, TESTS, TemplateError


# --------------------------------------------------------------------------------------
# Lexer (jinja2.lexer with trim_blocks=True, lstrip_blocks=True)
# --------------------------------------------------------------------------------------

_NEWLINE = re.compile(r"\r\n|\r|\n")
_WHITESPACE = re.compile(r"\s+")
# Text up to the next tag; the group after each tag start is its whitespace-control sign.
_ROOT = re.compile(
    r"(.*?)(?:(?P<raw_begin>\{%(-|\+|)\s*raw\s*(?:-%\}\s*|%\}))"
    r"|(?P<variable_begin>\{\{(-|\+|))|(?P<comment_begin>\{#(-|\+|))"
    r"|(?P<block_begin>\{%(-|\+|)))", re.S)
_COMMENT_END = re.compile(r"(.*?)((?:\+#\}|-#\}\s*|#\}\n?))", re.S)
_RAW_END = re.compile(r"(.*?)((?:\{%(-|\+|))\s*endraw\s*(?:\+%\}|-%\}\s*|%\}\n?))", re.S)
_BLOCK_END = re.compile(r"\+%\}|-%\}\s*|%\}\n?")  # trim_blocks eats one newline
_VARIABLE_END = re.compile(r"-\}\}\s*|\}\}")
_FLOAT = re.compile(r"(?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+\-]?(\d+_)*\d+|\.(\d+_)*\d+)", re.I)
_INTEGER = re.compile(r"(0b(_?[0-1])+|0o(_?[0-7])+|0x(_?[\da-f])+|[1-9](_?\d)*|0(_?0)*)", re.I)
_NAME = re.compile(r"\w+")
_STRING = re.compile(r"('([^'\\]*(?:\\.[^'\\]*)*)'|\"([^\"\\]*(?:\\.[^\"\\]*)*)\")", re.S)
_OPERATORS = ["//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
              "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"]
_OPERATOR = re.compile("|".join(re.escape(op) for op in _OPERATORS))
_CLOSING = {"(": ")", "[": "]", "{": "}"}


def _strip_before_tag(text, sign, is_variable, line_starting):
    """Whitespace control for the text before a tag: `{%-` strips all of it; otherwise
    lstrip_blocks removes the indentation before a `{%`/`{#` that starts its line."""
    if sign == "-":
        return text.rstrip()
    if sign != "+" and not is_variable:
        l_pos = text.rfind("\n") + 1
        if (l_pos > 0 or line_starting) and _WHITESPACE.fullmatch(text, l_pos):
            return text[:l_pos]
    return text


def lex(source):
    """Tokens as (type, value, lineno); type is data, variable_begin/end, block_begin/end,
    name, string, integer, float, operator (value: its symbol) or eof."""
    lines = _NEWLINE.split(source)
    if lines and lines[-1] == "":
        del lines[-1]  # keep_trailing_newline=False drops one final newline
    source = "\n".join(lines)
    tokens = []
    pos, lineno, line_starting = 0, 1, True
    while pos < len(source):
        m = _ROOT.match(source, pos)
        if m is None:
            tokens.append(("data", source[pos:], lineno))
            break
        kind = next(k for k in ("raw_begin", "variable_begin", "comment_begin", "block_begin")
                    if m.group(k) is not None)
        sign = m.group(m.re.groupindex[kind] + 1)
        text = _strip_before_tag(m.group(1), sign, kind == "variable_begin", line_starting)
        if text:
            tokens.append(("data", text, lineno))
        lineno += m.group(1).count("\n")
        tag_line = lineno
        lineno += m.group().count("\n") - m.group(1).count("\n")
        pos = m.end()
        line_starting = m.group()[-1:] == "\n"
        if kind == "comment_begin":
            end = _COMMENT_END.match(source, pos)
            if end is None:
                raise TemplateError("Missing end of comment tag", tag_line)
        elif kind == "raw_begin":
            end = _RAW_END.match(source, pos)
            if end is None:
                raise TemplateError("Missing end of raw directive", tag_line)
            text = _strip_before_tag(end.group(1), end.group(3), False, line_starting)
            if text:
                tokens.append(("data", text, lineno))
        else:
            end = None
            pos, lineno = _lex_tag(source, pos, lineno, kind, tokens, tag_line)
            line_starting = source[pos - 1:pos] == "\n"
        if end is not None:
            lineno += end.group().count("\n")
            pos = end.end()
            line_starting = end.group()[-1:] == "\n"
    tokens.append(("eof", None, lineno))
    return tokens


def _lex_tag(source, pos, lineno, kind, tokens, tag_line):
    """Tokens of one {{ ... }} or {% ... %}; returns the position and line after its end."""
    is_block = kind == "block_begin"
    tokens.append((kind, None, tag_line))
    end_re = _BLOCK_END if is_block else _VARIABLE_END
    balance = []
    while True:
        if pos >= len(source):
            raise TemplateError(f"unexpected end of template, expected "
                                f"{'%}' if is_block else '}}'}", tag_line)
        if not balance:  # an end tag only counts outside brackets, as in jinja2
            m = end_re.match(source, pos)
            if m:
                tokens.append(("block_end" if is_block else "variable_end", None, lineno))
                return m.end(), lineno + m.group().count("\n")
        m = _WHITESPACE.match(source, pos)
        if m:
            lineno += m.group().count("\n")
            pos = m.end()
            continue
        for regex, typ in ((_FLOAT, "float"), (_INTEGER, "integer"), (_NAME, "name"),
                           (_STRING, "string"), (_OPERATOR, "operator")):
            m = regex.match(source, pos)
            if m:
                break
        else:
            raise TemplateError(f"unexpected char {source[pos]!r}", lineno)
        text = m.group()
        if typ == "float":
            value = float(text.replace("_", ""))
        elif typ == "integer":
            value = int(text.replace("_", ""), 0)
        elif typ == "name":
            if not text.isidentifier():
                raise TemplateError(f"Invalid character in identifier {text!r}", lineno)
            value = text
        elif typ == "string":
            # jinja2 decodes string literals with Python's unicode-escape rules
            try:
                value = (text[1:-1].encode("ascii", "backslashreplace")
                         .decode("unicode-escape"))
            except UnicodeDecodeError as e:
                raise TemplateError(f"invalid string literal: {e}", lineno) from None
        else:
            value = text
            if text in _CLOSING:
                balance.append(_CLOSING[text])
            elif text in (")", "]", "}"):
                if not balance or balance.pop() != text:
                    raise TemplateError(f"unexpected {text!r}", lineno)
        tokens.append((typ, value, lineno))
        lineno += text.count("\n")
        pos = m.end()


# --------------------------------------------------------------------------------------
# Parser (jinja2.parser): statements and expressions to tuple nodes
# --------------------------------------------------------------------------------------
#
# Expression nodes, (kind, lineno, ...):
#   const value | name id | list items | tuple items | dict [(k, v)] | getattr obj attr
#   getitem obj key | slice start stop step | call func args kwargs dyn_args dyn_kwargs
#   filter node name args kwargs dyn_args dyn_kwargs | test <same as filter>
#   not x | neg x | pos x | and l r | or l r | binop op l r | concat [items]
#   compare first [(op, expr)] | condexpr test then else_or_None | nsref name attr
# Statement nodes:
#   output [str | expr] | if [(test, body)] else_body | for target iter filter body else_body
#   set target expr | setblock target filter body | macro name params defaults body flags
#   callblock call params defaults body flags | filterblock filter body
#   with targets values body | scope body | break | continue

_COMPARE_OPS = ("==", "!=", "<", "<=", ">", ">=")
_UNSUPPORTED_TAGS = {
    "extends": "template inheritance", "block": "blocks", "include": "includes",
    "import": "imports", "from": "imports", "autoescape": "autoescape blocks",
    "do": "the do statement (needs jinja2.ext.do, which transformers does not load)",
    "trans": "i18n", "debug": "the debug statement",
}


class Parser:
    def __init__(self, tokens):
        self.tokens = tokens
        self.pos = 0
        self.loop_depth = 0  # break/continue are only valid inside a for body
        self.statements = {
            "for": self.parse_for, "if": self.parse_if, "set": self.parse_set,
            "macro": self.parse_macro, "call": self.parse_call_block,
            "filter": self.parse_filter_block, "with": self.parse_with,
            "print": self.parse_print, "break": self.parse_loop_control,
            "continue": self.parse_loop_control, "generation": self.parse_generation,
        }

    # ---- token stream helpers
    @property
    def current(self):
        return self.tokens[self.pos]

    def look(self):
        return self.tokens[min(self.pos + 1, len(self.tokens) - 1)]

    def next(self):
        tok = self.tokens[self.pos]
        if tok[0] != "eof":
            self.pos += 1
        return tok

    def is_(self, typ, value=None):
        tok = self.tokens[self.pos]
        return tok[0] == typ and (value is None or tok[1] == value)

    def is_name(self, *names):
        tok = self.tokens[self.pos]
        return tok[0] == "name" and tok[1] in names

    def skip_if(self, typ, value=None):
        if self.is_(typ, value):
            return self.next()
        return None

    def expect(self, typ, value=None):
        tok = self.current
        if not self.is_(typ, value):
            want = value if value is not None else typ
            got = tok[1] if tok[1] is not None else tok[0]
            raise TemplateError(f"expected {want!r}, got {got!r}", tok[2])
        return self.next()

    def fail(self, message, lineno=None):
        raise TemplateError(message, self.current[2] if lineno is None else lineno)

    # ---- statements
    def parse(self):
        body = self.subparse(())
        _check_names(body, False)
        return body

    def subparse(self, end_names):
        body, data = [], []
        data_line = 0

        def flush():
            if data:
                body.append(("output", data_line, list(data)))
                data.clear()
        while not self.is_("eof"):
            typ, value, lineno = self.current
            if not data:
                data_line = lineno
            if typ == "data":
                data.append(value)
                self.next()
            elif typ == "variable_begin":
                self.next()
                data.append(self.parse_tuple())
                self.expect("variable_end")
            elif typ == "block_begin":
                flush()
                self.next()
                if end_names and self.is_name(*end_names):
                    return body
                body.append(self.parse_statement())
                self.expect("block_end")
            else:
                self.fail(f"unexpected {value!r}")
        flush()
        if end_names:
            self.fail(f"unexpected end of template: missing "
                      f"{' or '.join('{% ' + n + ' %}' for n in end_names)}")
        return body

    def parse_statements(self, end_names, drop_needle=False):
        self.skip_if("operator", ":")
        self.expect("block_end")
        body = self.subparse(end_names)
        if drop_needle:
            self.next()
        return body

    def parse_statement(self):
        typ, name, lineno = self.current
        if typ != "name":
            self.fail("tag name expected")
        handler = self.statements.get(name)
        if handler is None:
            if name in _UNSUPPORTED_TAGS:
                self.fail(f"{{% {name} %}} ({_UNSUPPORTED_TAGS[name]}) is not supported by "
                          f"colibri's chat-template renderer")
            self.fail(f"unknown tag {name!r}")
        return handler()

    def parse_for(self):
        lineno = self.next()[2]
        target = self.parse_assign_target(end_names=("in",))
        self.expect("name", "in")
        iterable = self.parse_tuple(with_condexpr=False, end_names=("recursive",))
        test = self.parse_expression() if self.skip_if("name", "if") else None
        if self.is_name("recursive"):
            self.fail("recursive for loops are not supported by colibri's chat-template "
                      "renderer")
        self.loop_depth += 1
        body = self.parse_statements(("endfor", "else"))
        self.loop_depth -= 1
        else_ = [] if self.next()[1] == "endfor" else self.parse_statements(("endfor",), True)
        return ("for", lineno, target, iterable, test, body, else_)

    def parse_if(self):
        lineno = self.next()[2]
        branches, else_ = [], []
        while True:
            test = self.parse_tuple(with_condexpr=False)
            body = self.parse_statements(("elif", "else", "endif"))
            branches.append((test, body))
            tok = self.next()
            if tok[1] == "elif":
                continue
            if tok[1] == "else":
                else_ = self.parse_statements(("endif",), True)
            break
        return ("if", lineno, branches, else_)

    def parse_set(self):
        lineno = self.next()[2]
        target = self.parse_assign_target(with_namespace=True)
        if self.skip_if("operator", "="):
            return ("set", lineno, target, self.parse_tuple())
        filt = self.parse_filter(None) if self.is_("operator", "|") else None
        body = self.parse_statements(("endset",), True)
        return ("setblock", lineno, target, filt, body)

    def parse_macro(self):
        lineno = self.next()[2]
        name = self.expect("name")[1]
        params, defaults = self.parse_signature()
        body = self.parse_macro_body("endmacro")
        return ("macro", lineno, name, params, defaults, body, _macro_flags(body))

    def parse_macro_body(self, end_name):
        saved, self.loop_depth = self.loop_depth, 0  # a loop outside does not count inside
        body = self.parse_statements((end_name,), True)
        self.loop_depth = saved
        return body

    def parse_call_block(self):
        lineno = self.next()[2]
        if self.is_("operator", "("):
            params, defaults = self.parse_signature()
        else:
            params, defaults = [], {}
        call = self.parse_expression()
        if call[0] != "call":
            self.fail("expected call", lineno)
        body = self.parse_macro_body("endcall")
        return ("callblock", lineno, call, params, defaults, body, _macro_flags(body))

    def parse_signature(self):
        params, defaults = [], {}
        self.expect("operator", "(")
        while not self.is_("operator", ")"):
            if params:
                self.expect("operator", ",")
            name = self.expect("name")[1]
            if self.skip_if("operator", "="):
                defaults[name] = self.parse_expression()
            elif defaults:
                self.fail("non-default argument follows default argument")
            params.append(name)
        self.expect("operator", ")")
        return params, defaults

    def parse_filter(self, node, start_inline=False):
        while self.is_("operator", "|") or start_inline:
            if not start_inline:
                self.next()
            tok = self.expect("name")
            name = tok[1]
            while self.skip_if("operator", "."):
                name += "." + self.expect("name")[1]
            args = self.parse_call_args() if self.is_("operator", "(") else ([], [], None, None)
            node = ("filter", tok[2], node, name) + args
            start_inline = False
        return node

    def parse_filter_block(self):
        lineno = self.next()[2]
        filt = self.parse_filter(None, start_inline=True)
        body = self.parse_statements(("endfilter",), True)
        return ("filterblock", lineno, filt, body)

    def parse_with(self):
        lineno = self.next()[2]
        targets, values = [], []
        while not self.is_("block_end"):
            if targets:
                self.expect("operator", ",")
            targets.append(self.parse_assign_target())
            self.expect("operator", "=")
            values.append(self.parse_expression())
        body = self.parse_statements(("endwith",), True)
        return ("with", lineno, targets, values, body)

    def parse_print(self):
        lineno = self.next()[2]
        nodes = []
        while not self.is_("block_end"):
            if nodes:
                self.expect("operator", ",")
            nodes.append(self.parse_expression())
        return ("output", lineno, nodes)

    def parse_loop_control(self):
        typ, name, lineno = self.next()
        if not self.loop_depth:
            self.fail(f"{{% {name} %}} outside of a for loop", lineno)
        return (name, lineno)

    def parse_generation(self):
        # transformers' {% generation %} marks assistant text for masks; it renders its body
        lineno = self.next()[2]
        return ("scope", lineno, self.parse_macro_body("endgeneration"))

    def parse_assign_target(self, end_names=(), with_namespace=False):
        lineno = self.current[2]
        target = self.parse_tuple(simplified=True, end_names=end_names,
                                  with_namespace=with_namespace)
        if not _can_assign(target):
            self.fail(f"can't assign to {target[0]!r}", lineno)
        return target

    # ---- expressions
    def parse_expression(self, with_condexpr=True):
        return self.parse_condexpr() if with_condexpr else self.parse_or()

    def parse_condexpr(self):
        lineno = self.current[2]
        expr1 = self.parse_or()
        while self.skip_if("name", "if"):
            expr2 = self.parse_or()
            expr3 = self.parse_condexpr() if self.skip_if("name", "else") else None
            expr1 = ("condexpr", lineno, expr2, expr1, expr3)
        return expr1

    def parse_or(self):
        left = self.parse_and()
        while self.is_name("or"):
            lineno = self.next()[2]
            left = ("or", lineno, left, self.parse_and())
        return left

    def parse_and(self):
        left = self.parse_not()
        while self.is_name("and"):
            lineno = self.next()[2]
            left = ("and", lineno, left, self.parse_not())
        return left

    def parse_not(self):
        if self.is_name("not"):
            lineno = self.next()[2]
            return ("not", lineno, self.parse_not())
        return self.parse_compare()

    def parse_compare(self):
        lineno = self.current[2]
        expr = self.parse_math1()
        ops = []
        while True:
            if self.current[0] == "operator" and self.current[1] in _COMPARE_OPS:
                op = self.next()[1]
                ops.append((op, self.parse_math1()))
            elif self.skip_if("name", "in"):
                ops.append(("in", self.parse_math1()))
            elif self.is_name("not") and self.look()[0] == "name" and self.look()[1] == "in":
                self.next()
                self.next()
                ops.append(("notin", self.parse_math1()))
            else:
                break
        return ("compare", lineno, expr, ops) if ops else expr

    def _binary(self, ops, parse_operand):
        left = parse_operand()
        while self.current[0] == "operator" and self.current[1] in ops:
            lineno = self.current[2]
            op = self.next()[1]
            left = ("binop", lineno, op, left, parse_operand())
        return left

    def parse_math1(self):
        return self._binary(("+", "-"), self.parse_concat)

    def parse_concat(self):
        lineno = self.current[2]
        args = [self.parse_math2()]
        while self.skip_if("operator", "~"):
            args.append(self.parse_math2())
        return args[0] if len(args) == 1 else ("concat", lineno, args)

    def parse_math2(self):
        return self._binary(("*", "/", "//", "%"), self.parse_pow)

    def parse_pow(self):
        # jinja2 makes ** left-associative: 2**3**2 == 64
        return self._binary(("**",), self.parse_unary)

    def parse_unary(self, with_filter=True):
        lineno = self.current[2]
        if self.skip_if("operator", "-"):
            node = ("neg", lineno, self.parse_unary(False))
        elif self.skip_if("operator", "+"):
            node = ("pos", lineno, self.parse_unary(False))
        else:
            node = self.parse_primary()
        node = self.parse_postfix(node)
        if with_filter:
            node = self.parse_filter_expr(node)
        return node

    def parse_primary(self, with_namespace=False):
        typ, value, lineno = self.current
        if typ == "name":
            self.next()
            if value in ("true", "false", "True", "False"):
                return ("const", lineno, value in ("true", "True"))
            if value in ("none", "None"):
                return ("const", lineno, None)
            if with_namespace and self.is_("operator", "."):
                self.next()
                return ("nsref", lineno, value, self.expect("name")[1])
            return ("name", lineno, value)
        if typ == "string":
            self.next()
            parts = [value]
            while self.is_("string"):  # adjacent literals concatenate
                parts.append(self.next()[1])
            return ("const", lineno, "".join(parts))
        if typ in ("integer", "float"):
            self.next()
            return ("const", lineno, value)
        if self.is_("operator", "("):
            self.next()
            node = self.parse_tuple(explicit_parentheses=True)
            self.expect("operator", ")")
            return node
        if self.is_("operator", "["):
            return self.parse_list()
        if self.is_("operator", "{"):
            return self.parse_dict()
        self.fail(f"unexpected {value if value is not None else typ!r}")

    def _is_tuple_end(self, end_names):
        typ, value, _ = self.current
        if typ in ("variable_end", "block_end", "eof") or (typ == "operator" and value == ")"):
            return True
        return typ == "name" and value in end_names

    def parse_tuple(self, simplified=False, with_condexpr=True, end_names=(),
                    explicit_parentheses=False, with_namespace=False):
        lineno = self.current[2]
        args, is_tuple = [], False
        while True:
            if args:
                self.expect("operator", ",")
            if self._is_tuple_end(end_names):
                break
            if simplified:
                args.append(self.parse_primary(with_namespace=with_namespace))
            else:
                args.append(self.parse_expression(with_condexpr))
            if self.is_("operator", ","):
                is_tuple = True
            else:
                break
        if not is_tuple:
            if args:
                return args[0]
            if not explicit_parentheses:
                self.fail("Expected an expression")
        return ("tuple", lineno, args)

    def parse_list(self):
        lineno = self.expect("operator", "[")[2]
        items = []
        while not self.is_("operator", "]"):
            if items:
                self.expect("operator", ",")
            if self.is_("operator", "]"):
                break
            items.append(self.parse_expression())
        self.expect("operator", "]")
        return ("list", lineno, items)

    def parse_dict(self):
        lineno = self.expect("operator", "{")[2]
        items = []
        while not self.is_("operator", "}"):
            if items:
                self.expect("operator", ",")
            if self.is_("operator", "}"):
                break
            key = self.parse_expression()
            self.expect("operator", ":")
            items.append((key, self.parse_expression()))
        self.expect("operator", "}")
        return ("dict", lineno, items)

    def parse_postfix(self, node):
        while True:
            if self.is_("operator", ".") or self.is_("operator", "["):
                node = self.parse_subscript(node)
            elif self.is_("operator", "("):
                node = ("call", self.current[2], node) + self.parse_call_args()
            else:
                return node

    def parse_filter_expr(self, node):
        while True:
            if self.is_("operator", "|"):
                node = self.parse_filter(node)
            elif self.is_name("is"):
                node = self.parse_test(node)
            elif self.is_("operator", "("):
                node = ("call", self.current[2], node) + self.parse_call_args()
            else:
                return node

    def parse_subscript(self, node):
        typ, value, lineno = self.next()
        if value == ".":
            attr = self.next()
            if attr[0] == "name":
                return ("getattr", lineno, node, attr[1])
            if attr[0] != "integer":
                self.fail("expected name or number", attr[2])
            return ("getitem", lineno, node, ("const", lineno, attr[1]))
        args = []
        while not self.is_("operator", "]"):
            if args:
                self.expect("operator", ",")
            args.append(self.parse_subscribed())
        self.expect("operator", "]")
        key = args[0] if len(args) == 1 else ("tuple", lineno, args)
        return ("getitem", lineno, node, key)

    def parse_subscribed(self):
        lineno = self.current[2]
        if self.skip_if("operator", ":"):
            args = [None]
        else:
            node = self.parse_expression()
            if not self.skip_if("operator", ":"):
                return node
            args = [node]
        if self.is_("operator", ":"):
            args.append(None)
        elif not (self.is_("operator", "]") or self.is_("operator", ",")):
            args.append(self.parse_expression())
        else:
            args.append(None)
        if self.skip_if("operator", ":"):
            if not (self.is_("operator", "]") or self.is_("operator", ",")):
                args.append(self.parse_expression())
            else:
                args.append(None)
        else:
            args.append(None)
        return ("slice", lineno) + tuple(args)

    def parse_call_args(self):
        lineno = self.expect("operator", "(")[2]
        args, kwargs, dyn_args, dyn_kwargs = [], [], None, None
        require_comma = False
        while not self.is_("operator", ")"):
            if require_comma:
                self.expect("operator", ",")
                if self.is_("operator", ")"):
                    break
            if self.skip_if("operator", "*"):
                if dyn_args is not None or dyn_kwargs is not None:
                    self.fail("invalid syntax for function call expression", lineno)
                dyn_args = self.parse_expression()
            elif self.skip_if("operator", "**"):
                if dyn_kwargs is not None:
                    self.fail("invalid syntax for function call expression", lineno)
                dyn_kwargs = self.parse_expression()
            elif self.current[0] == "name" and self.look()[0] == "operator" \
                    and self.look()[1] == "=":
                if dyn_kwargs is not None:
                    self.fail("invalid syntax for function call expression", lineno)
                key = self.next()[1]
                self.next()
                kwargs.append((key, self.parse_expression()))
            else:
                if dyn_args is not None or dyn_kwargs is not None or kwargs:
                    self.fail("invalid syntax for function call expression", lineno)
                args.append(self.parse_expression())
            require_comma = True
        self.expect("operator", ")")
        return (args, kwargs, dyn_args, dyn_kwargs)

    def parse_test(self, node):
        lineno = self.next()[2]
        negated = bool(self.skip_if("name", "not"))
        name = self.expect("name")[1]
        while self.skip_if("operator", "."):
            name += "." + self.expect("name")[1]
        args = ([], [], None, None)
        typ, value, _ = self.current
        if self.is_("operator", "("):
            args = self.parse_call_args()
        elif (typ in ("name", "string", "integer", "float")
              or (typ == "operator" and value in ("(", "[", "{"))) \
                and not (typ == "name" and value in ("else", "or", "and")):
            if typ == "name" and value == "is":
                self.fail("You cannot chain multiple tests with is")
            args = ([self.parse_postfix(self.parse_primary())], [], None, None)
        node = ("test", lineno, node, name) + args
        return ("not", lineno, node) if negated else node


# Nodes whose children jinja2 compiles in a fresh frame, which is never "soft"
_INNER_FRAMES = ("macro", "callblock", "filterblock", "setblock", "scope")


def _check_names(obj, soft):
    """Unknown filters and tests fail at compile time, as jinja2 does, except inside an
    {% if %} or an inline if (a "soft" frame), where jinja2 defers the error to the call:
    templates guard filters the environment may lack, e.g. DeepSeek-V3.2's `from_json`."""
    if isinstance(obj, (list, dict)):
        for item in (obj.values() if isinstance(obj, dict) else obj):
            _check_names(item, soft)
        return
    if not isinstance(obj, tuple) or not obj or not isinstance(obj[0], str):
        if isinstance(obj, tuple):
            for item in obj:
                _check_names(item, soft)
        return
    kind = obj[0]
    if kind in ("filter", "test") and len(obj) > 3 and not soft:
        name = obj[3]
        known = (name in FILTERS or name in JINJA_ONLY_FILTERS) if kind == "filter" \
            else name in TESTS
        if not known:
            raise TemplateError(f"No {kind} named {name!r}.", obj[1])
    if kind in ("if", "condexpr"):
        soft = True
    elif kind == "for":  # only the iterable is evaluated in the enclosing frame
        _check_names(obj[3], soft)
        _check_names(list(obj[2:3] + obj[4:]), False)
        return
    elif kind == "with":  # the values are evaluated in the enclosing frame
        _check_names(obj[3], soft)
        _check_names([obj[2], obj[4]], False)
        return
    elif kind in _INNER_FRAMES:
        soft = False
    for item in obj[1:]:
        _check_names(item, soft)


def _can_assign(node):
    if node[0] in ("name", "nsref"):
        return node[0] != "name" or node[2] not in ("true", "false", "none", "True",
                                                      "False", "None")
    if node[0] == "tuple":
        return all(_can_assign(item) for item in node[2])
    return False


def _macro_flags(body):
    """(catch_varargs, catch_kwargs, caller): which of jinja2's implicit macro names the
    body reads, found the way jinja2 finds them (any name node in the body)."""
    found = set()

    def walk(obj):
        if isinstance(obj, tuple):
            if len(obj) >= 3 and obj[0] == "name" and isinstance(obj[2], str):
                found.add(obj[2])
            for item in obj:
                walk(item)
        elif isinstance(obj, list):
            for item in obj:
                walk(item)
        elif isinstance(obj, dict):
            for item in obj.values():
                walk(item)
    walk(body)
    return ("varargs" in found, "kwargs" in found, "caller" in found)
