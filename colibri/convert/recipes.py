"""--quant NAME: named storage settings, chosen from the KL table of docs/kl_pareto.md (colibri's
own writers at each llama.cpp point, Q2_K to Q6_K: no more bytes per decoded token, no more KL).

Each recipe fills --experts, --dense and --tensor-type; a flag given beside it wins for its part.
The token embedding is kept at 6 bits in every low-bit recipe: a decoded token reads one row of it,
so it costs disk and RAM (about 6.6 bits x vocab x hidden), not bytes per token, and on the table's
model it is most of the KL a 4-bit embedding adds. Calibration (--calibrate TEXT) is separate: on
SmolLM2's real weights it cut the low-bit KL 2.6-5.4x.

The output head, which every decoded token reads whole (most of its bytes on the table's model),
is colibri's q6 (32-element blocks, 6.5 bits) in the recipes below q6-mix: fewer bytes than
q6_k's 6.56 at about the same KL, and its dot streamed at the memory rate when q6_k's was bound
by its decode. q6-mix keeps q6_k's head: the q6 head raised its KL 16 % (4.1e-5, at Q6_K's 4.2e-5)."""

HEAD6 = {"lm_head": "q6", "embed": "q6_k"}

RECIPES = {
    "q2-mix": dict(experts="q2_k", dense="q2_k", tensor_types={"attn_v": "q4_k", **HEAD6},
                   about="2.6-bit K-quants, 4-bit value projections, 6-bit embedding, q6 head (the Q2_K point)"),
    "q3-mix": dict(experts="q3_k", dense="q3_k", tensor_types={"attn_v": "q5_k", **HEAD6},
                   about="3.4-bit K-quants, 5-bit value projections, 6-bit embedding, q6 head (the Q3_K_M point)"),
    "iq4-mix": dict(experts="iq4_xs", dense="iq4_xs", tensor_types=dict(HEAD6),
                    about="4.25-bit IQ4_XS, 6-bit embedding, q6 head (the IQ4_XS point)"),
    "q4-mix": dict(experts="q4_k", dense="q4_k", tensor_types={"attn_v": "q6_k", **HEAD6},
                   about="4.5-bit Q4_K, 6-bit value projections and embedding, q6 head (the Q4_K_M point)"),
    "q5-mix": dict(experts="q5_k", dense="q5_k", tensor_types={"attn_v": "q6_k", **HEAD6},
                   about="5.5-bit Q5_K, 6-bit value projections and embedding, q6 head (the Q5_K_M point)"),
    "q6-mix": dict(experts="q6_k", dense="q6_k", tensor_types={},
                   about="6.6-bit Q6_K everywhere (the Q6_K point)"),
}


def resolve(name, experts, dense, tensor_types, log):
    """(experts, dense, tensor_types) of recipe `name` under the flags given beside it (None: not
    given); log names each part a flag overrode. name None: the flags as they are."""
    if name is None:
        return experts, dense, tensor_types
    r = RECIPES[name]
    given = [f"--{flag} {v}" for flag, v in (("experts", experts), ("dense", dense)) if v and v != r[flag]]
    given += [f"--tensor-type {c}={t}" for c, t in tensor_types.items() if r["tensor_types"].get(c, t) != t]
    if given:
        log(f"--quant {name}: {', '.join(given)} given beside it, in place of the recipe's")
    return experts or r["experts"], dense or r["dense"], {**r["tensor_types"], **tensor_types}
