"""The launcher's import map (tools/py_layers.py): its modules stand on floors (data, base, family,
template, model, chat, server, commands, launcher) and none imports upward, sits in a circle, or
names a family outside colibri/family/ and the registry. The checker's own tests show it fails on
each."""
from pathlib import Path

import py_layers  # tools/, on the path through pytest.ini

ROOT = Path(__file__).resolve().parent.parent

# Shared modules that name families and keep doing so, each with why.
FAMILY_ALLOWED = {
    # llama.cpp names its tokenizers after model lines (tokenizer.ggml.pre = qwen2, llama3, ...;
    # tokenizer.ggml.model = llama): the reader's table maps those keys onto HF pre-tokenizers
    "colibri.convert.gguf": "GGUF's tokenizer names (and a message on llama.cpp's permuted Q/K) are the format's own",
    "colibri.convert.gguf_spm": "the SentencePiece vocabulary GGUF calls `llama`",
    # tool-call syntaxes are named after the model line that introduced them (hermes, glm, ...)
    "colibri.toolcall.formats": "tool-call syntaxes carry the name of the model line that defined them",
    "colibri.toolcall.forced": "tool-call syntaxes carry the name of the model line that defined them",
    "colibri.chat.harmony": "the harmony format is gpt-oss's chat format",
    "colibri.cli.chat": "messages that say which model speaks harmony",
    "colibri.server.config": "an example model id in a message",
}


def test_the_launcher_has_no_upward_import_no_circle_and_no_stray_family_name():
    problems, graph = py_layers.check(ROOT, family_allowed=FAMILY_ALLOWED)
    assert len(graph) > 80  # it read the tree
    assert not problems, "\n".join(problems)


def test_every_allowed_family_module_still_exists_and_names_a_family():
    files = py_layers.module_files(ROOT)
    for name in FAMILY_ALLOWED:
        assert name in files, f"{name} is gone: take it off FAMILY_ALLOWED"
        assert py_layers.family_names(name, files[name]), f"{name} names no family now: take it off FAMILY_ALLOWED"


def tree(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_checker_accepts_a_clean_tree(tmp_path):
    root = tree(tmp_path, {"colibri/__init__.py": "", "colibri/limits.py": "X = 1\n",
                           "colibri/server/__init__.py": "", "colibri/server/http.py": "from colibri import limits\n",
                           "colibri/cli/__init__.py": "", "colibri/cli/chat.py": "import colibri.server.http\n",
                           "coli": "from colibri.cli import chat\n", "version.py": "VERSION = '1'\n"})
    problems, graph = py_layers.check(root)
    assert problems == []
    assert graph["coli"] == {"colibri.cli.chat": 1}
    assert graph["colibri.server.http"] == {"colibri.limits": 1}


def test_the_checker_fails_on_an_upward_import_even_inside_a_function(tmp_path):
    root = tree(tmp_path, {"colibri/__init__.py": "", "colibri/model/__init__.py": "",
                           "colibri/model/store.py": "def f():\n    from colibri.cli.common import UserError\n",
                           "colibri/cli/__init__.py": "", "colibri/cli/common.py": "class UserError(Exception): pass\n"})
    assert py_layers.check(root)[0] == ["colibri.model.store:2 (model) imports colibri.cli.common (commands)"]


def test_the_checker_fails_when_the_package_imports_a_command_module(tmp_path):
    command = "HELP = 'x'\n\ndef run(args):\n    return 0\n"
    root = tree(tmp_path, {"colibri/__init__.py": "", "colibri/cli/__init__.py": "",
                           "colibri/cli/web.py": "import openai_server\n", "openai_server.py": "",
                           "colibri/cli/list.py": command, "colibri/cli/rm.py": "from colibri.cli import list\n" + command,
                           "colibri/cli/common.py": "", "colibri/cli/ps.py": "from colibri.cli import common\n" + command})
    assert py_layers.check(root)[0] == ["colibri.cli.rm:1 imports the command module colibri.cli.list",
                                        "colibri.cli.web:1 imports the command module openai_server"]


def test_the_checker_fails_when_the_data_imports_the_package(tmp_path):
    root = tree(tmp_path, {"colibri/__init__.py": "", "colibri/family/__init__.py": "",
                           "colibri/family/common.py": "", "family_registry.py": "from colibri.family import common\n"})
    assert py_layers.check(root)[0] == ["family_registry:1 (data) imports colibri.family.common (family)"]


def test_the_checker_fails_on_a_circle(tmp_path):
    root = tree(tmp_path, {"colibri/__init__.py": "", "colibri/convert/__init__.py": "",
                           "colibri/convert/hf.py": "from . import weights_x\n",
                           "colibri/convert/weights_x.py": "def f():\n    from colibri.convert import hf\n"})
    problems = py_layers.check(root)[0]
    assert problems == ["circle: colibri.convert.hf <-> colibri.convert.weights_x"]


def test_the_checker_fails_on_a_family_name_in_shared_code(tmp_path):
    root = tree(tmp_path, {"colibri/__init__.py": "", "colibri/server/__init__.py": "",
                           "colibri/server/text.py": '"""Docs may say qwen3."""\n'
                                                     'def f(family):\n    return family == "deepseek_v3"\n',
                           "colibri/family/__init__.py": "", "colibri/family/qwen3.py": "NAME = 'qwen3'\n",
                           "colibri/cli/__init__.py": "", "colibri/cli/bench.py": "PEER = 'llama.cpp'\n"})
    assert py_layers.check(root)[0] == ["colibri.server.text:3 names the family 'deepseek'"]


def test_the_checker_fails_on_a_module_on_no_floor(tmp_path):
    root = tree(tmp_path, {"stray.py": ""})
    assert py_layers.check(root)[0] == ["stray: on no floor (add it to FLOORS in tools/py_layers.py)"]
