"""GGUF tensors as float32 rows, dequantized by the engine's convert-jobs (c/kernels/gguf_quants.c reads
every block type the GGUF importer accepts), for the tensors whose values the importer must
change before the normal row copy: stdlib only, and as fast as the engine's row decoders."""
import os
import subprocess
import tempfile

from colibri.errors import ConvertError
from colibri.convert.hf import engine_binary


def source_dtype(info):
    """The convert-jobs source dtype of a GGUF tensor."""
    return info.type_name if info.type_name in ("F32", "F16", "BF16") else f"GGUF_{info.type_name}"


def to_f32(g, pieces, dst, what):
    """pieces: [(info, offset)]: each whole tensor as float32 rows at its byte offset in dst,
    which is created (or cut) to end after the last one. what names the tensors for errors."""
    jobs, end = [], 0
    for info, off in pieces:
        cols = info.shape[0]
        jobs.append(f"{g.file_of(info)}\t{info.offset}\t{source_dtype(info)}\t{info.n_elements // cols}\t{cols}\t{dst}\t{off}\tf32\n")
        end = max(end, off + info.n_elements * 4)
    with open(dst, "wb") as f:
        f.truncate(end)
    with tempfile.NamedTemporaryFile("w", suffix=".jobs", delete=False) as jf:
        jf.writelines(jobs)
    try:
        r = subprocess.run([str(engine_binary()), "convert-jobs", jf.name], capture_output=True, text=True)
    finally:
        os.unlink(jf.name)
    if r.returncode:
        errors = [x for x in r.stderr.splitlines() if not x.startswith("PROGRESS ")]
        raise ConvertError(f"dequantizing {what} failed: {' '.join(errors) or f'engine exit code {r.returncode}'}")
