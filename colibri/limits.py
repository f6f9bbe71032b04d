"""The engine's fixed numbers as the launcher uses them: how many KV slots it has and how a
quantized row is laid out. Defined here once for Python; `colibri limits` prints the engine's
own values (c/engine/engine.h, c/kernels/quant.h, c/model/forward.c) and tests/test_limits.py checks that the two agree."""

MAX_KV_SLOTS = 16  # c/engine/engine.h MAX_KV_SLOTS
DEFAULT_BATCH = 128  # positions per prefill forward pass without --batch, c/model/model.h FORWARD_DEFAULT_BATCH
DEFAULT_BATCH_AMX = 512  # the same where the engine runs its amx kernel set, FORWARD_DEFAULT_BATCH_AMX


def default_batch(kernels):
    """The engine's prefill batch without --batch when it runs the kernel set `kernels`
    (machine probe's engine_kernels): AMX tiles want more positions per expert."""
    return DEFAULT_BATCH_AMX if kernels == "amx" else DEFAULT_BATCH
DEFAULT_SPIN = 1000  # GOMP_SPINCOUNT of an engine given no --spin, profile or environment setting
MAX_SPIN = 10_000_000_000  # --spin's upper end: about seconds of spinning, far past any useful wait
RUNTIME_BASE = 16 << 20  # engine working memory before any scratch, c/engine/engine_stream.h RUNTIME_BASE_BYTES
QBLOCK = 32  # values per quantized block, c/kernels/quant.h QBLOCK
BLOCK_BYTES = {"q8": 34, "q4": 20, "mxfp4": 17, "q6": 26}  # f16 scale + 32 int8; f16 scale + f16 min + 16 nibble
# bytes; e8m0 scale + 16 bytes of e2m1 nibbles (gpt-oss releases' format, c/kernels/mxfp4.c); f16 scale + 16 nibble
# bytes + 8 bytes of high bit pairs (c/kernels/quant.h)

# GGUF's low-bit blocks the converter writes from float weights (c/kernels/lowbit_quantize.h); the
# lattice i-quants (iq1_*, iq2_*, iq3_*) are kept from GGUF files only.
WRITABLE_LOWBIT = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "iq4_nl")
EXPERT_STORAGE = ("q4", "q6", "q8", "bf16", "f32", "mxfp4") + WRITABLE_LOWBIT  # what a container may hold routed
DENSE_STORAGE = ("q8", "q6", "q4", "bf16", "f32") + WRITABLE_LOWBIT  # experts as, and the dense trunk
# GGUF's names of the storage types that are its blocks byte for byte (q4 pads a row's last block
# where GGUF refuses such a row; every row GGUF holds is the same bytes)
STORAGE_ALIASES = {"q8_0": "q8", "q4_1": "q4"}

# GGUF's low-bit blocks, held in the container as llama.cpp writes them (c/kernels/lowbit.h):
# storage -> (elements, bytes) per block. A row is whole blocks (GGUF rows always are), never padded.
LOWBIT_BLOCKS = {"q2_k": (256, 84), "q3_k": (256, 110), "iq1_s": (256, 50), "iq1_m": (256, 56),
                 "iq2_xxs": (256, 66), "iq2_xs": (256, 74), "iq2_s": (256, 82), "iq3_xxs": (256, 98),
                 "iq3_s": (256, 110), "iq4_nl": (32, 18), "iq4_xs": (256, 136), "q5_k": (256, 176),
                 "q6_k": (256, 210), "q4_k": (256, 144)}

# storage type -> safetensors dtype of its tensors (the quantized ones are raw bytes)
STORAGE_DTYPE = {"f32": "F32", "bf16": "BF16", "f16": "F16", "q8": "U8", "q4": "U8", "mxfp4": "U8", "q6": "U8",
                 **{k: "U8" for k in LOWBIT_BLOCKS}}
_VALUE_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


def row_bytes(storage, cols):
    """Bytes one stored row of `cols` logical columns takes (KeyError for an unknown storage)."""
    if storage in BLOCK_BYTES:
        return -(-cols // QBLOCK) * BLOCK_BYTES[storage]
    if storage in LOWBIT_BLOCKS:
        block, size = LOWBIT_BLOCKS[storage]
        if cols % block:
            raise ValueError(f"a {storage} row of {cols} columns is not whole {block}-element blocks")
        return cols // block * size
    return _VALUE_BYTES[storage] * cols


def fitted_storage(storage, cols):
    """The storage a row of `cols` columns gets when `storage` was asked for: a low-bit type whose
    block does not divide the row falls back, as llama-quantize does, to iq4_nl (32-element
    blocks) or, when even that does not fit, to q4 (which pads its last block)."""
    block = LOWBIT_BLOCKS.get(storage, (1,))[0]
    if cols % block == 0:
        return storage
    return "iq4_nl" if cols % LOWBIT_BLOCKS["iq4_nl"][0] == 0 else "q4"


def engine_report(exe):
    """`colibri limits` as a dict of ints (name -> value)."""
    import subprocess
    out = subprocess.run([str(exe), "limits"], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines() if line.strip())}
