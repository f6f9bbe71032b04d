"""The engine's import map (tools/c_layers.py): the folders of c/ are bands, bottom to top, and
no file uses a band above its own or sits in a circle of files, by #include or by symbol. The
checker's own tests show it fails on an upward use and on a circle."""
import subprocess
from pathlib import Path

import c_layers  # tools/, on the path through pytest.ini
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_engine_has_no_upward_use_and_no_circle():
    obj = ROOT / "build" / "obj" / "rel"
    if not any(obj.glob("*/*.o")):
        pytest.fail("build/obj/rel has no objects: run `make` first (make test does)", pytrace=False)
    problems, files = c_layers.check(ROOT / "c", obj)
    assert not problems, "\n".join(problems)
    assert len(files) > 50  # it read the tree


def tree(tmp_path, sources):
    """A fake engine tree: c/<band>/<file> with the given text, each .c compiled to obj/."""
    c, obj = tmp_path / "c", tmp_path / "obj"
    for name, text in sources.items():
        (c / name).parent.mkdir(parents=True, exist_ok=True)
        (c / name).write_text(text)
    for name in sources:
        if name.endswith(".c"):
            out = obj / Path(name).with_suffix(".o")
            out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["gcc", "-c", "-I", str(c), "-o", str(out), str(c / name)], check=True)
    return c, obj


def test_the_checker_accepts_a_clean_tree(tmp_path):
    c, obj = tree(tmp_path, {
        "util/a.h": "int a(void);\n", "util/a.c": '#include "util/a.h"\nint a(void) { return 1; }\n',
        "engine/b.c": '#include "util/a.h"\nint b(void) { return a(); }\n'})
    assert c_layers.check(c, obj)[0] == []


def test_the_checker_fails_on_an_upward_include_and_call(tmp_path):
    c, obj = tree(tmp_path, {
        "engine/b.h": "int b(void);\n", "engine/b.c": '#include "engine/b.h"\nint b(void) { return 2; }\n',
        "util/a.c": '#include "engine/b.h"\nint a(void) { return b(); }\n'})
    problems = c_layers.check(c, obj)[0]
    assert any("c/util/a.c (util) uses c/engine/b.h (engine)" in p for p in problems), problems
    assert any("c/util/a.c (util) uses c/engine/b.c (engine)" in p for p in problems), problems


def test_the_checker_fails_on_a_circle_of_files(tmp_path):
    c, obj = tree(tmp_path, {
        "model/x.c": "int y(void);\nint x(void) { return y(); }\n",
        "model/y.c": "int x(void);\nint y(void) { return x(); }\n"})
    problems = c_layers.check(c, obj)[0]
    assert problems == ["circle between files: c/model/x -> c/model/y"], problems


def test_the_checker_fails_on_a_file_outside_the_bands(tmp_path):
    c, obj = tree(tmp_path, {"misc/z.c": "int z(void) { return 0; }\n"})
    assert any("c/misc/z.c: in no band" in p for p in c_layers.check(c, obj)[0])
