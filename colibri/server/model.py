"""What the server knows about the model it serves: identity, sampling defaults
(colibri/sampling.py), the chat template and whether the family thinks in <think> blocks."""
import hashlib
import json
import os
from pathlib import Path

import family_registry
from colibri.chat_template import render as chat_template
from colibri.chat_template import literal as chat_template_literal
from colibri import sampling
from colibri.chat import harmony

# Used when a checkpoint ships no chat template (like the tiny test models), so chat endpoints
# still work; the start-up log and /health say so. --chat-template FILE gives the right one.
CHATML = ("{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")


class ModelInfo:
    def __init__(self, model_dir, model_id, template_file=None, log=print, aliases=(), any_name=False):
        self.dir = Path(model_dir)
        self.id = model_id
        self.names = [model_id] + [a for a in aliases if a != model_id]  # every name requests may use
        self.any_name = any_name
        raw = (self.dir / "colibri.json").read_bytes()
        self.manifest = json.loads(raw)
        self.fingerprint = hashlib.sha256(raw).hexdigest()
        self.created = int(os.path.getmtime(self.dir / "colibri.json"))
        self.defaults, self.default_sources = sampling.model_defaults(self.dir)
        fam = family_registry.FAMILIES.get(self.manifest.get("family"), {})
        self.family_display = fam.get("display") or self.manifest.get("family")
        self.tool_format = fam.get("tools") or None  # colibri/toolcall/formats.py; None: no tool calling
        self.special = chat_template.load_special_tokens(self.dir)
        self.template, self.template_error, self.template_origin = None, None, "model"
        try:
            if template_file:
                self.template, self.template_origin = Path(template_file).read_text(encoding="utf-8"), "file"
            else:
                self.template = chat_template.load_chat_template(self.dir)
        except chat_template.TemplateError as e:
            self.template, self.template_origin = CHATML, "chatml-fallback"
            log(f"WARNING: {e}; chat requests use a generic ChatML template, which may not be what this model "
                f"was trained on (pass --chat-template FILE)")
        except (OSError, ValueError) as e:
            self.template_error = str(e)
            log(f"chat completions are disabled: cannot read the chat template ({e}); use /v1/completions")
        try:  # without them message text could turn into control tokens: no chat then
            self.added_tokens = chat_template_literal.load_added_tokens(str(self.dir))
        except (OSError, ValueError) as e:
            self.added_tokens = chat_template_literal.AddedTokens()
            self.template, self.template_error = None, f"cannot read the added tokens of tokenizer.json ({e})"
            log(f"chat completions are disabled: {self.template_error}; use /v1/completions")
        self.thinks = self._has_think_tags()
        self.family_facts = fam
        self.harmony = (self.template is not None and self.template_origin != "chatml-fallback"
                        and harmony.uses_harmony(self.template, self.family_facts))

    def serves(self, name):
        """True when a request naming `name` is for this model: one of its names (--model-id), or any
        name with --any-model-name."""
        return self.any_name or name in self.names

    def _has_think_tags(self):
        if self.template and "<think>" in self.template:
            return True
        try:
            tok = json.loads((self.dir / "tokenizer.json").read_text(encoding="utf-8"))
            return any(t.get("content") == "<think>" for t in tok.get("added_tokens", []))
        except (OSError, ValueError, AttributeError):
            return False

    def render(self, messages, add_generation_prompt=True, continue_final_message=False, **kwargs):
        """Messages -> chat_template_literal.Prompt with the model's own template, the caller's
        strings kept as text (no role injection); raises chat_template.TemplateError."""
        if self.template is None:
            raise chat_template.TemplateError(self.template_error or "the model has no chat template")
        return chat_template_literal.render_prompt(self.template, messages, self.added_tokens, model_vars=self.special,
                                                   add_generation_prompt=add_generation_prompt,
                                                   continue_final_message=continue_final_message, **kwargs)

    def expert_summary(self):
        a, q = self.manifest.get("arch", {}), self.manifest.get("quant", {})
        return {"family": self.manifest.get("family"), "experts_per_layer": a.get("num_experts", 0),
                "active_experts": a.get("num_experts_per_tok", 0),
                "moe_layers": sum(1 for k in a.get("layer_mlp", []) if k == "moe"),
                "quant": {"experts": q.get("experts"), "dense": q.get("dense")}}
