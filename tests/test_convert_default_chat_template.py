"""A deepseek_v4 checkpoint ships no chat template (the release encodes chats with a Python script), so
`coli convert` writes the packaged default, llama.cpp's DeepSeek-V4 template, as chat_template.jinja and
says so; the container then chats exactly as jinja2 renders that text. A checkpoint's own template wins."""
import json
import shutil
from pathlib import Path

import pytest

from colibri.chat_template import render as ct
from colibri.convert import default_chat_template
from test_chat_template import reference_render
from test_gpt_oss import coli

ROOT = Path(__file__).resolve().parent
PACKAGED = ROOT.parent / "colibri" / "chat_template" / "defaults" / "deepseek_v4.jinja"
OFFICIAL = ROOT / "data" / "chat_templates" / "deepseek-ai-DeepSeek-V4.jinja"
BF16 = ["--experts", "bf16", "--dense", "bf16"]
CHATS = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
         [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."},
          {"role": "user", "content": "Again?"}]]


def checkpoint(oracle_root, tmp_path):
    src = tmp_path / "hf"
    shutil.copytree(Path(oracle_root) / "deepseek_v4" / "hf", src)
    assert not default_chat_template.has_chat_template(src)
    return src


def test_the_test_data_is_the_packaged_template():
    # one copy: the test data is a link to the text the converter ships
    assert OFFICIAL.is_symlink() and OFFICIAL.resolve() == PACKAGED.resolve()


def test_a_checkpoint_without_a_template_gets_the_default(oracle_root, tmp_path):
    out = tmp_path / "c"
    log = coli("convert", checkpoint(oracle_root, tmp_path), out, *BF16).stderr
    assert "no chat template" in log and "chat_template.jinja" in log and "llama.cpp" in log
    official = OFFICIAL.read_text(encoding="utf-8")
    assert (out / "chat_template.jinja").read_text(encoding="utf-8") == official
    tokens = ct.load_special_tokens(out)  # the tiny oracle's tokenizer, not the release's
    for messages in CHATS:
        for kw in ({}, {"thinking": True}):
            got = ct.render_for_model(out, messages, **kw)
            assert got == reference_render(official, messages, special_tokens=tokens, **kw)
            assert "<｜User｜>" in got and got.endswith("<｜Assistant｜><think>" if kw else "<｜Assistant｜></think>")


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_the_checkpoints_own_template_is_kept(oracle_root, tmp_path, where):
    src = checkpoint(oracle_root, tmp_path)
    own = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    if where == "chat_template.jinja":
        (src / where).write_text(own, encoding="utf-8")
    else:
        cfg = json.loads((src / where).read_text(encoding="utf-8"))
        (src / where).write_text(json.dumps({**cfg, "chat_template": own}), encoding="utf-8")
    out = tmp_path / "c"
    log = coli("convert", src, out, *BF16).stderr
    assert "no chat template" not in log
    assert (out / "chat_template.jinja").exists() == (where == "chat_template.jinja")
    assert ct.render_for_model(out, CHATS[0], add_generation_prompt=False) == "[system] Be brief.\n[user] 2+2?\n"


def test_other_families_get_no_default(tmp_path):
    assert not default_chat_template.write_default(tmp_path, "mixtral", print)
    assert not (tmp_path / "chat_template.jinja").exists()
