"""colibri/family/parts.py, the one lookup from a family to the module of its own parts: its rows
are registry families, every GGUF architecture maps to the module that declares it, and the hook
names the GGUF converter asks for are the ones the modules define (a misspelt hook would
otherwise be silently passed over for the shared builders' way)."""
import re
import types
from pathlib import Path

import family_registry
from colibri.family import parts

ROOT = Path(__file__).resolve().parents[1]


def test_every_row_is_a_registry_family():
    assert set(parts.MODULES) <= set(family_registry.FAMILIES)


def test_every_gguf_architecture_maps_to_the_module_that_declares_it():
    assert list(parts.GGUF_ARCHS)[:4] == ["llama", "qwen2", "qwen3", "qwen3moe"]  # the order the help lists
    for arch, family in parts.GGUF_ARCHS.items():
        assert family in family_registry.FAMILIES
        assert parts.gguf_module(family).GGUF_ARCHS[arch] == family
    assert parts.gguf_family("llama", {"llama.expert_count": 8}) == "mixtral"  # llama.cpp's Mixtral
    assert parts.gguf_family("llama", {}) == "llama"


def test_the_gguf_hooks_asked_for_are_the_ones_the_modules_define():
    source = "".join((ROOT / "colibri" / "convert" / f).read_text() for f in ("gguf.py", "gguf_names.py"))
    asked = set(re.findall(r"reader\.(\w+)", source)) | set(re.findall(r"attr\(reader, \"(\w+)\"", source))
    assert asked | {"GGUF_ARCHS", "gguf_family"} == set(parts.GGUF_HOOKS)  # those two parts.py reads itself
    for module in set(parts.MODULES.values()):
        defined = {n for n, v in vars(module).items()
                   if n.lower().startswith("gguf_") and not isinstance(v, types.ModuleType)}
        assert defined <= set(parts.GGUF_HOOKS), f"{module.__name__}: {sorted(defined - set(parts.GGUF_HOOKS))}"
