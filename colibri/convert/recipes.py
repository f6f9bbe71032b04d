"""--quant NAME: named storage settings, chosen from the KL table of docs/kl_pareto.md (colibri's
own writers at each llama.cpp point, IQ2_XXS to Q6_K: no more bytes per decoded token, no more KL).

Each recipe fills --experts, --dense and --tensor-type; a flag given beside it wins for its part.
The token embedding is kept at 6 bits in every low-bit recipe: a decoded token reads one row of it,
so it costs disk and RAM (about 6.6 bits x vocab x hidden), not bytes per token, and on the table's
model it is most of the KL a 4-bit embedding adds. Calibration (--calibrate TEXT) is separate: on
SmolLM2's real weights it cut the low-bit KL 2.6-5.4x.

The output head, which every decoded token reads whole (most of its bytes on the table's model),
sets each recipe's place. The -mix recipes from q4 up keep a 6-bit head, the lowest KL at the
point: colibri's q6 (32-element blocks, 6.5 bits: fewer bytes than q6_k's 6.56 at about the
same KL), and q6-mix q6_k's, as the q6 head raised its KL 16 %, to Q6_K's. The -fast recipes,
q2-mix and q3-mix take a 4-bit (q4_k) or 5-bit (q5_k) head: 1.2-1.4x fewer head bytes and a
faster decode, for a KL that stays below the point's on the table's model (4-9x below at q2-mix
and q3-mix, 5-18 % below at q4-fast and q5-fast; docs/kl_pareto.md).

q4-fast and q5-fast store the rest in colibri's q4 and q6 blocks, not the K-quants: on CPUs with
VNNI their dots of few positions multiply int8 pairs and streamed at 85-96 % of the memory rate
on the table's Zen 4, where the K-quant dots multiply the int16 activations and are bound by
their arithmetic (the q2_k experts of q2-mix read half q4's bytes in more time). On AVX2 alone
both multiply int16 pairs; the table was not measured there. Those writers are round-to-nearest:
calibration weighs only their K-quant heads."""

HEAD6 = {"lm_head": "q6", "embed": "q6_k"}
HEAD4 = {"lm_head": "q4_k", "embed": "q6_k"}
HEAD5 = {"lm_head": "q5_k", "embed": "q6_k"}

RECIPES = {
    "q2-mix": dict(experts="q2_k", dense="q2_k", tensor_types={"attn_v": "q4_k", **HEAD4},
                   about="2.6-bit K-quants, 4-bit value projections and head, 6-bit embedding (the Q2_K, IQ2_XXS and IQ3_XXS points)"),
    "q3-mix": dict(experts="q3_k", dense="q3_k", tensor_types={"attn_v": "q5_k", **HEAD4},
                   about="3.4-bit K-quants, 5-bit value projections, 4-bit head, 6-bit embedding (the Q3_K_M point)"),
    "iq4-mix": dict(experts="iq4_xs", dense="iq4_xs", tensor_types=dict(HEAD6),
                    about="4.25-bit IQ4_XS, 6-bit embedding, q6 head (the IQ4_XS point)"),
    "q4-mix": dict(experts="q4_k", dense="q4_k", tensor_types={"attn_v": "q6_k", **HEAD6},
                   about="4.5-bit Q4_K, 6-bit value projections and embedding, q6 head (the Q4_K_M point, 5x lower KL)"),
    "q4-fast": dict(experts="q4", dense="q4", tensor_types={"attn_v": "q6", **HEAD4},
                    about="colibri's own 5-bit q4 blocks (the int8 multiply-add kernels), 6-bit value projections and "
                          "embedding, 4-bit head: the fastest decode and prefill from the Q2_K to the Q4_K_M point"),
    "q5-mix": dict(experts="q5_k", dense="q5_k", tensor_types={"attn_v": "q6_k", **HEAD6},
                   about="5.5-bit Q5_K, 6-bit value projections and embedding, q6 head (the Q5_K_M point, 2x lower KL)"),
    "q5-fast": dict(experts="q4", dense="q6", tensor_types=dict(HEAD5),
                    about="colibri's q4 experts and q6 trunk, 6-bit embedding, 5-bit head: 0.89x Q5_K_M's "
                          "bytes a token at a lower KL, its fastest decode"),
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
