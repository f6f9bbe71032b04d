"""`coli convert SRC OUT`: a Hugging Face checkpoint or a GGUF file -> a colibri container."""
import argparse
import sys
import textwrap
from pathlib import Path

from colibri import launch_opts
from colibri.cli.common import add_storage_flags, storage_of
from colibri.cli import calibration as calibrate
from colibri.convert import gguf as convert_gguf
from colibri.convert import hf as convert_hf
from colibri.errors import ConvertError, UserError

HELP = "convert a Hugging Face safetensors checkpoint or a GGUF file into a colibri container"
# the GGUF architectures and tensor types are the GGUF converter's own tables
DESCRIPTION = f"""Convert a checkpoint into a colibri container directory.

SRC is either
  a Hugging Face checkpoint directory: config.json + *.safetensors (bf16, fp16 or fp32), or
  a GGUF file (llama.cpp's format, name ending in .gguf) whose general.architecture is one of
  {textwrap.fill(", ".join(convert_gguf.ARCHS), 88, subsequent_indent="  ")}
  with {", ".join(convert_gguf.SUPPORTED_TYPES)} tensors.
--experts and --dense choose the storage of routed experts and of the dense trunk. A GGUF
block colibri can hold exactly is kept (Q8_0 -> q8; Q4_0, Q4_1, Q4_K -> q4), so a 4-bit
source stays 4-bit under q8; Q2_K, Q3_K and the IQ types keep their own blocks under any block
type, Q5_K and Q6_K theirs under q6, and Q4_K-Q6_K theirs under a K-quant at least as wide
(q4_k, q5_k, q6_k; bf16 and f32 dequantize); `coli info` shows what each
tensor class got. --tensor-type CLASS=TYPE gives one class another type (e.g. down=q6 or
attention=q8, repeatable). OUT must be new or empty; an interrupted conversion with the
same settings resumes there, and a conversion with other settings is refused."""
FORMATTER = argparse.RawDescriptionHelpFormatter  # the SRC list keeps its lines


def add_arguments(c):
    c.add_argument("src", help="a Hugging Face checkpoint directory (config.json + *.safetensors) or a .gguf file")
    c.add_argument("out", help="output container directory (new or empty; an interrupted conversion resumes there)")
    add_storage_flags(c)
    c.add_argument("--imatrix", metavar="FILE", default=None,
                   help="the importance matrix (GGUF, from llama.cpp's imatrix tool) of this model: weighs the errors of the "
                        "q2_k-q6_k/iq4_xs/iq4_nl writers by each column's mean squared activation")
    c.add_argument("--calibrate", metavar="TEXT", default=None,
                   help="collect that importance here: run the model over this text file (chunks of "
                        f"{calibrate.CHUNK} tokens, as llama.cpp's imatrix) and weigh the low-bit writers by what it saw")
    c.add_argument("--calibrate-model", dest="calibrate_model", metavar="DIR", default=None,
                   help="with --calibrate: run this container of the same checkpoint (e.g. its default conversion) "
                        "instead of converting one with 8-bit blocks first")
    launch_opts.add_engine_flags(c, ("threads",) + launch_opts.STREAM_FLAGS, group="the engine of --calibrate",
                                 threads={"help": "compute threads (default: all cores)"})


def run(args):
    log = lambda *a, **k: print(*a, **k, file=sys.stderr, flush=True)  # noqa: E731
    experts, dense, types = storage_of(args, log)
    dense = dense or "q8"
    src = Path(args.src)
    if not src.exists():
        raise UserError(f"{src}: no such file or directory; give a Hugging Face checkpoint directory or a .gguf file")
    if src.is_file() and src.suffix != ".gguf":
        raise UserError(f"{src} is a file but not a .gguf file; give a .gguf file or a Hugging Face checkpoint "
                        "directory (config.json + *.safetensors)")
    if args.calibrate_model and not args.calibrate:
        raise UserError("--calibrate-model names the model --calibrate runs; give --calibrate TEXT too")
    convert = convert_gguf.convert if src.is_file() else convert_hf.convert
    imatrix = args.imatrix
    if args.calibrate:
        calibrate.check_settings(experts, dense, types, args.imatrix)
        imatrix = calibrate.statistics(src, args.out, args.calibrate, args,
                                       lambda d: convert(src, d, experts="q8", dense="q8", log=log), log)
    try:
        convert(src, args.out, experts=experts, dense=dense, log=log, imatrix=imatrix, tensor_types=types)
    except ConvertError as e:
        raise UserError(str(e)) from None
    if args.calibrate:
        calibrate.remove_work(args.out, log)
