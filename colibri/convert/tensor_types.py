"""--tensor-type CLASS=TYPE: one tensor class stored in another block type than --experts/--dense
give it, as llama-quantize's mixes do (Q4_K_M raises ffn_down and attn_v; dynamic 2-bit quants
keep attention and shared experts at 4-8 bits).

The classes are the ones `coli info` reports (family_registry.TENSOR_CLASSES), by output tensor
name, so a conversion and the report of it always agree on what a class holds. `down` is every
down projection (routed, shared and dense MLP) and wins over the class it is in; `attn_v`, the
value projections of GQA attention, wins over `attention`."""
import re

from colibri.limits import DENSE_STORAGE, STORAGE_ALIASES

CLASSES = {
    "attention": "every attention matrix (q/k/v/o, MLA's low-rank pairs, linear attention)",
    "shared_expert": "the shared experts of MoE layers (resident)",
    "dense_mlp": "the MLP of the dense layers (the first layers of several MoE models)",
    "down": "every down projection: routed experts, shared experts and dense MLP",
    "attn_v": "the value projections of GQA attention (llama.cpp's attn_v; MLA has none)",
    "embed": "the token embedding table",
    "lm_head": "the output head",
}
DOWN_RE = re.compile(r"\.(down_proj|w2)\.weight$")
DOWN_OF = ("expert", "shared_expert", "dense_mlp")  # the classes whose down projections `down` takes
ATTN_V_RE = re.compile(r"\.self_attn\.v_proj\.weight$")


def parse(values):
    """['CLASS=TYPE', ...] -> {class: storage}; ValueError with the reason for a bad one. A class
    given twice is refused rather than the later one silently winning."""
    types = {}
    for v in values or ():
        cls, sep, qtype = v.partition("=")
        cls, qtype = cls.strip(), STORAGE_ALIASES.get(qtype.strip(), qtype.strip())
        if not sep or not cls or not qtype:
            raise ValueError(f"--tensor-type {v!r}: give CLASS=TYPE, e.g. attention=q8 or down=q6")
        if cls == "expert":
            raise ValueError("--tensor-type expert=...: routed experts take --experts")
        if cls not in CLASSES:
            raise ValueError(f"--tensor-type {v!r}: unknown class {cls!r}; the classes are {', '.join(CLASSES)}")
        if qtype not in DENSE_STORAGE:
            raise ValueError(f"--tensor-type {v!r}: {qtype!r} is not a storage type; give one of {', '.join(DENSE_STORAGE)}")
        if cls in types and types[cls] != qtype:
            raise ValueError(f"--tensor-type gives {cls} twice ({types[cls]} and {qtype}); give it once")
        types[cls] = qtype
    return types


def type_for(name, types):
    """The storage `types` asks for output tensor `name`, or None when no class of it is overridden."""
    if not types:
        return None
    from colibri.model.container_scan import tensor_class  # here: `coli --help` does not load the registry
    cls = tensor_class(name)
    if "down" in types and cls in DOWN_OF and DOWN_RE.search(name):
        return types["down"]
    if "attn_v" in types and cls == "attention" and ATTN_V_RE.search(name):
        return types["attn_v"]
    return types.get(cls)
