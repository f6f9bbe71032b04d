"""Chat templates written into containers whose checkpoint ships none.

Some releases describe their prompt format in code rather than a chat_template (DeepSeek-V4
encodes chats with a Python script), so a straight copy leaves `coli chat` / `coli serve` unable
to format a chat. For such families the converter writes the template llama.cpp's converter
writes into the same model's GGUFs; a checkpoint's own template always wins.
"""
import shutil
from pathlib import Path

import family_registry
from colibri.chat_template.render import TemplateError, load_chat_template

DEFAULTS_DIR = Path(__file__).resolve().parents[1] / "chat_template" / "defaults"


def has_chat_template(model_dir):
    """Whether `coli chat` would find a template in the directory."""
    try:
        load_chat_template(str(model_dir))
    except TemplateError:
        return False
    return True


def write_default(out, family, log):
    """Write the family's default template into the converted directory `out` when it has none."""
    default = family_registry.FAMILIES.get(family, {}).get("default_chat_template")  # (packaged file, origin)
    if default is None or has_chat_template(out):
        return False
    fname, origin = default
    shutil.copyfile(DEFAULTS_DIR / fname, Path(out) / "chat_template.jinja")
    log(f"note: the checkpoint ships no chat template; wrote chat_template.jinja from {origin}")
    return True
