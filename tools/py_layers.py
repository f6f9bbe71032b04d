"""The launcher's import map: the Python modules (coli, the root modules, colibri/) stand on
floors, bottom to top, and no module imports one on a floor above its own, sits in a circle of
modules, or names a model family outside the family layer. Run: PYTHONPATH=. python tools/py_layers.py

Every import counts, at the top of a file or inside a function: a lazy import still draws the
arrow. `import a.b` draws an arrow to a.b (and its package a); `from a import b` to a.b when
a/b.py exists, else to a.
"""
import ast
import re
import sys
from pathlib import Path

# Floors, bottom to top: (name, module prefixes). A module sits on the floor of its longest
# matching prefix; it may import modules on its own floor (no circle) and on floors below.
FLOORS = (
    # pure data the design names at the top level: they import nothing from the package
    ("data", ("family_registry", "version")),
    # leaf helpers every layer may use: limits, errors, paths, checksums, child processes
    ("base", ("colibri", "colibri.limits", "colibri.errors", "colibri.checksum", "colibri.children",
              "colibri.grammar", "colibri.machine")),
    ("family", ("colibri.family",)),
    # Jinja chat templates: the converter checks a default one, the chat layer renders them
    ("template", ("colibri.chat_template",)),
    ("model", ("colibri.model", "colibri.convert", "colibri.engine_client", "colibri.engine_status", "colibri.sampling")),
    # chat logic shared by the terminal and the HTTP server
    ("chat", ("colibri.chat", "colibri.toolcall")),
    # the engine and sampling flags every command and the server's config share
    ("launch", ("colibri.launch_opts",)),
    ("server", ("colibri.server",)),
    # the commands: one module each, under colibri/cli/ or (those the design names) at the top
    ("commands", ("colibri.cli", "openai_server", "resource_plan", "doctor", "autotune")),
    ("launcher", ("coli",)),
)
# Command modules at the top level; those in colibri/cli/ are the ones that define HELP and run
# (is_command). Nothing under colibri/ imports a command: `coli` dispatches to them.
ROOT_COMMANDS = ("openai_server", "resource_plan", "doctor", "autotune")

# Family names that only the family layer and the registry spell. Shared code asks the
# registry's flags instead of testing for a family.
FAMILY_WORDS = ("qwen2", "qwen3", "qwen35", "qwen3_5", "deepseek", "glm", "mixtral", "olmoe", "gpt_oss",
                "gpt-oss", "kimi", "mimo", "minimax", "llama")
# llama.cpp's tools (the peer `coli bench` runs, the defaults `coli serve` matches) are not the family
FAMILY_RE = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(re.escape(w) for w in FAMILY_WORDS) + r")"
                       r"(?![.\-_ ]?(cpp|server|bench))", re.I)
FAMILY_HOME = ("family_registry", "colibri.family")


def module_files(root):
    """{module name: path} for coli, the root .py modules and colibri/."""
    root = Path(root)
    out = {}
    if (root / "coli").is_file():
        out["coli"] = root / "coli"
    for f in sorted(root.glob("*.py")):
        out[f.stem] = f
    for f in sorted((root / "colibri").rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imports(name, path, known):
    """The known modules `name` imports, each with the line of its first import."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found = {}

    def add(target, line):
        while target and target not in known:
            target = target.rpartition(".")[0]  # `from a.b import f`: a.b is the module
        if target and target != name:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}" if base else a.name
                add(sub if sub in known else base, node.lineno)
    return found


def is_command(name, path):
    """A root command module, or a module of colibri/cli/ with a top-level HELP and run()."""
    if name in ROOT_COMMANDS:
        return True
    if not name.startswith("colibri.cli."):
        return False
    body = ast.parse(path.read_text(), str(path)).body
    runs = any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in body)
    helps = any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "HELP" for t in n.targets)
                for n in body)
    return runs and helps


def floor_of(name):
    best, at = None, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > at:
                best, at = i, len(p)
    return best


def circles(graph):
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def family_names(name, path):
    """(line, word) for each family name in the module's code: identifiers, attributes and string
    constants (docstrings and comments may name families: they explain, they do not branch)."""
    tree = ast.parse(path.read_text(), str(path))
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
    hits = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.alias):
            text = node.name + " " + (node.asname or "")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            text = node.name
        elif isinstance(node, ast.arg):
            text = node.arg
        elif isinstance(node, ast.ImportFrom) and node.module:
            text = node.module
        if text:
            for m in FAMILY_RE.finditer(text):
                hits.append((getattr(node, "lineno", 0), m.group(1).lower()))
    return sorted(set(hits))


def check(root, family_allowed=()):
    """(problems, graph). family_allowed: module names whose family names are known and kept."""
    files = module_files(root)
    known = set(files)
    graph, problems = {}, []
    for name, path in files.items():
        graph[name] = imports(name, path, known)
    commands = {name for name, path in files.items() if is_command(name, path)}
    for name in sorted(graph):
        mine = floor_of(name)
        if mine is None:
            problems.append(f"{name}: on no floor (add it to FLOORS in tools/py_layers.py)")
            continue
        for target, line in sorted(graph[name].items()):
            theirs = floor_of(target)
            if theirs is not None and theirs > mine:
                problems.append(f"{name}:{line} ({FLOORS[mine][0]}) imports {target} ({FLOORS[theirs][0]})")
            elif name.startswith("colibri") and target in commands:
                problems.append(f"{name}:{line} imports the command module {target}")
    for comp in circles({k: set(v) for k, v in graph.items()}):
        problems.append("circle: " + " <-> ".join(comp))
    for name in sorted(files):
        home = any(name == h or name.startswith(h + ".") for h in FAMILY_HOME)
        if home or name in family_allowed:
            continue
        for line, word in family_names(name, files[name]):
            problems.append(f"{name}:{line} names the family '{word}'")
    return problems, graph


if __name__ == "__main__":
    probs, _ = check(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("."))
    print("\n".join(probs) or "clean")
    sys.exit(1 if probs else 0)
