"""Q4_K, Q5_K and Q6_K encoders (numpy) for GGUF test files: the `gguf` package dequantizes these
block types but cannot quantize them. Plain min/max and absmax fits, not llama.cpp's searched
scales; the block layouts are ggml's (block_q4_K / block_q5_K / block_q6_K), checked against
gguf.quants.dequantize in test_gguf_qwen35.py."""
import numpy as np

QK = 256


def _f16(x):
    return x.astype(np.float16)


def _pack_scales(sc, m):
    """8 six-bit scales and mins -> ggml's 12 bytes (get_scale_min_k4's layout)."""
    out = np.zeros(sc.shape[:-1] + (12,), np.uint8)
    out[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    out[..., 4:8] = (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)
    return out


def _affine(x, levels):
    """Q4_K / Q5_K: x ~ d*sc*q - dmin*m over 8 sub-blocks of 32 (q in 0..levels)."""
    sub = x.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(-1), 0)  # ggml subtracts a non-negative minimum
    scale, mins = (sub.max(-1) - lo) / levels, -lo
    d = _f16(scale.max(-1) / 63)
    dmin = _f16(mins.max(-1) / 63)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(np.divide(mins, dminf, out=np.zeros_like(mins), where=dminf > 0)), 0, 63).astype(np.uint8)
    step = (df * sc)[..., None]
    q = np.divide(sub + (dminf * m)[..., None], step, out=np.zeros_like(sub), where=step > 0)
    q = np.clip(np.rint(q), 0, levels).astype(np.uint8)
    head = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                           _pack_scales(sc, m)], axis=-1)
    return head, q


def _nibbles(q):
    """8 sub-blocks of 32 four-bit values -> 128 bytes: pair (2g, 2g+1) shares bytes 32g.. as low/high."""
    q = q.reshape(-1, 4, 2, 32) & 15
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)


def q4_k(x):
    head, q = _affine(x, 15)
    return np.concatenate([head, _nibbles(q)], axis=-1)


def q5_k(x):
    head, q = _affine(x, 31)
    hi = (q >> 4).reshape(-1, 8, 32)  # bit b of qh[i]: the fifth bit of sub-block b's element i
    qh = np.zeros((q.shape[0], 32), np.uint8)
    for b in range(8):
        qh |= hi[:, b] << b
    return np.concatenate([head, qh, _nibbles(q)], axis=-1)


def q6_k(x):
    """x ~ d*sc*q over 16 sub-blocks of 16, sc int8, q in -32..31."""
    sub = x.reshape(-1, 16, 16)
    scale = np.abs(sub).max(-1) / 31  # the largest magnitude lands on +-31, inside -32..31
    d = _f16(scale.max(-1) / 127)
    df = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, 127).astype(np.int8)
    step = (df * sc)[..., None]
    q = np.divide(sub, step, out=np.zeros_like(sub), where=step > 0)
    u = (np.clip(np.rint(q), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)  # two halves of 128
    ql = (u[:, :, :64] & 15) | ((u[:, :, 64:] & 15) << 4)  # element e of a half: byte e % 64, nibble e // 64
    hi = (u >> 4).reshape(-1, 2, 4, 32)  # byte i % 32 of the half, bits 2 * (e // 32)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)],
                          axis=-1)


ENCODERS = {"Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k}


def quantize(x, name):
    """float32 [..., cols] (cols a multiple of 256) -> GGUF row bytes [..., cols / 256 * block bytes]."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    assert x.shape[-1] % QK == 0, x.shape
    blocks = ENCODERS[name](x.reshape(-1, QK))
    return blocks.reshape(x.shape[:-1] + (x.shape[-1] // QK * blocks.shape[-1],))
