"""GGUF test tensors whose values a block type holds exactly. The `gguf` package reads the low-bit
types (Q2_K, Q3_K, the i-quants) but writes none of them, so their blocks are random valid bytes;
every other block type is quantized from the float weights. `ExactWeights.store` replaces a
tensor by what its blocks decode to (the reference model then runs the very values the GGUF file
holds) and hands the blocks to a GGUF writer row by row (`type_of`, `encode`)."""
import numpy as np
from needs import need

gguf = need("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

# the 1-4-bit K-quants and i-quants, kept as they are by every conversion to a block type
LOWBIT = ["Q2_K", "Q3_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS"]
# the engine's storage types of GGUF blocks in QType order (c/kernels/quant.h): LOWBIT, then the
# 5- and 6-bit K-quants, which the converter keeps where q6 is asked for, and Q4_K, kept where a
# K-quant is asked for
LOWBIT_STORAGE = LOWBIT + ["Q5_K", "Q6_K", "Q4_K"]
# byte offsets of a block's f16 scales; the i-quants: (0,)
F16_AT = {"Q2_K": (80, 82), "Q3_K": (108,), "Q5_K": (0, 2), "Q6_K": (208,), "Q4_K": (0, 2)}


def lowbit_blocks(name, rows, cols, rng, d_max=0.01):
    """Random valid blocks: every bit pattern of the codes, grid and sign indexes is valid, so
    the bytes are random except the f16 scales (finite, positive, at most d_max)."""
    qtype = T[name]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    d = ((rng.random((rows, cols // block, 2)) * 0.99 + 0.01) * d_max).astype(np.float16)
    if name == "IQ1_M":  # d's 16 bits are the top nibbles of the four u16 scale words
        bits = d[..., 0].view(np.uint16)
        sc = raw[:, :, 48:56].copy().view(np.uint16)
        for i in range(4):
            sc[..., i] = (sc[..., i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12).astype(np.uint16)
        raw[:, :, 48:56] = sc.view(np.uint8)
    else:
        for k, off in enumerate(F16_AT.get(name, (0,))):
            raw[:, :, off:off + 2] = d[..., k:k + 1].view(np.uint8)
    return raw.reshape(rows, -1)


def lowbit_like(name, x, rng):
    """Random blocks of type `name` for a tensor shaped like x, scaled to about x's standard
    deviation: (raw rows, their dequantization)."""
    rows, cols = int(np.prod(x.shape[:-1])), x.shape[-1]
    seed = int(rng.integers(1 << 31))
    probe = gguf.quants.dequantize(lowbit_blocks(name, rows, cols, np.random.default_rng(seed)), T[name])
    raw = lowbit_blocks(name, rows, cols, np.random.default_rng(seed), d_max=0.01 * float(x.std()) / float(probe.std()))
    return raw, gguf.quants.dequantize(raw, T[name])


class ExactWeights:
    """Float tensors rewritten to values of a GGUF type, remembered row by row for the writer."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.rows = {}  # a decoded row's bytes -> (type, its block bytes)

    def store(self, x, t):
        """x as type t holds it (a float32 array of x's shape)."""
        import gguf_kquant_encode
        x = np.ascontiguousarray(x, dtype=np.float32)
        if t == T.F32:
            return x
        if t == T.F16:
            return x.astype(np.float16).astype(np.float32)
        if t.name in LOWBIT:
            raw, deq = lowbit_like(t.name, x, self.rng)
        else:
            flat = x.reshape(-1, x.shape[-1])
            enc = gguf_kquant_encode.ENCODERS.get(t.name)
            raw = gguf_kquant_encode.quantize(flat, t.name) if enc else gguf.quants.quantize(flat, t)
            deq = gguf.quants.dequantize(raw, t)
        deq = np.ascontiguousarray(deq, dtype=np.float32).reshape(-1, x.shape[-1])
        for r, b in zip(deq, raw.reshape(deq.shape[0], -1)):
            self.rows[r.tobytes()] = (t, b)
        return deq.reshape(x.shape)

    def type_of(self, x):
        """The block type x's rows were stored as, None if they were not (float tensors)."""
        flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
        found = [self.rows.get(r.tobytes()) for r in flat]
        if not all(found) or len({f[0] for f in found}) != 1:
            return None
        return found[0][0]

    def encode(self, x, t):
        """The blocks of x's rows, shaped as gguf's writer takes raw data."""
        flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
        rows = []
        for r in flat:
            got = self.rows.get(r.tobytes())
            assert got is not None and got[0] == t, f"a row of a {t.name} tensor was not stored as {t.name}"
            rows.append(got[1])
        return np.stack(rows).reshape(x.shape[:-1] + (-1,))
