#!/usr/bin/env python3
"""atheris target: colibri/convert/gguf_reader.read_gguf on an arbitrary file. A hostile file must be refused
with GGUFError; a file it accepts must have every tensor inside the file, without overlaps."""
import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from colibri.convert import gguf_reader

PATH = os.path.join(tempfile.mkdtemp(prefix="coli_fuzz_"), "x.gguf")


def one_input(data):
    with open(PATH, "wb") as f:
        f.write(data)
    try:
        g = gguf_reader.read_gguf(PATH)
    except gguf_reader.GGUFError as e:
        assert str(e), "GGUFError without a message"
        return
    spans = sorted((t.offset, t.offset + t.nbytes) for t in g.tensors.values())
    for a, b in spans:
        assert g.data_start <= a <= b <= g.file_size, (a, b, g.data_start, g.file_size)
    for (_, a1), (b0, _) in zip(spans, spans[1:]):
        assert b0 >= a1, "overlapping tensors accepted"


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
