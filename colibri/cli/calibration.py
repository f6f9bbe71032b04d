"""`coli convert --calibrate TEXT`: activation statistics of the source model over calibration
text, collected by the engine (`colibri calibrate`, c/kernels/act_stats.h), for the low-bit
writers' importance weights (imatrix.py reads the file as it reads llama.cpp's imatrix).

The source runs as a colibri container: `--calibrate-model DIR` names one converted from the same
checkpoint, else one is converted here with 8-bit blocks (a GGUF source's low-bit blocks are kept,
so the statistics are the source's own). Its experts stream under the RAM budget (--ram, as for
`coli run`), so a model larger than RAM calibrates too. The work directory OUT.calibration holds
that container, the token ids and the statistics until the conversion is written; an interrupted
conversion rerun with the same text reuses the statistics there."""
import hashlib
import shutil
import subprocess
from pathlib import Path

from colibri import engine_client, launch_opts
from colibri.cli.common import tokenize_file
from colibri.convert.hf import STATE_FILE
from colibri.errors import ConvertError, UserError
from colibri.limits import WRITABLE_LOWBIT

CHUNK = 512  # positions per chunk, each from an empty context, as llama.cpp's imatrix runs


def work_dir(out):
    out = Path(out)
    return out.with_name(out.name + ".calibration")


def check_settings(experts, dense, tensor_types, imatrix):
    """Refuses, before any work, a --calibrate that could weigh nothing."""
    if imatrix is not None:
        raise UserError("--calibrate collects the statistics --imatrix would give: use one of them")
    if not {experts, dense, *tensor_types.values()} & set(WRITABLE_LOWBIT):
        raise UserError("--calibrate weighs the low-bit writers only (--experts/--dense/--tensor-type "
                        f"{', '.join(WRITABLE_LOWBIT)}); this conversion stores no tensor in one")


def check_output(out):
    """Refuses before the calibration run what the conversion would refuse after it: OUT must be
    new, empty or an interrupted conversion."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a directory; give a new or empty directory as the output")
    if (out / "colibri.json").exists():
        raise UserError(f"{out} already holds a converted model; --calibrate converts into a new or empty directory")
    if out.is_dir() and any(out.iterdir()) and not (out / STATE_FILE).exists():
        raise UserError(f"{out} is not empty and holds no conversion to resume; give a new or empty directory as the output")


def statistics(src, out, text, args, convert_source, log):
    """The statistics file for this conversion (in OUT.calibration), collected now or kept from
    an interrupted run over the same text and model. convert_source(dir) converts SRC to a
    calibration container in dir."""
    text, out = Path(text), Path(out)
    check_output(out)
    if not text.is_file():
        raise UserError(f"--calibrate {text}: no such file (give a text file to calibrate on)")
    work = work_dir(out)
    model = Path(args.calibrate_model) if args.calibrate_model else work / "model"
    digest = hashlib.sha256(text.read_bytes() + b"\0" + str(model.resolve()).encode()).hexdigest()[:16]
    stats = work / f"stats-{digest}"
    if stats.is_file():
        log(f"calibration: reusing {stats} (the same text and model)")
        return stats
    work.mkdir(parents=True, exist_ok=True)
    if not args.calibrate_model:
        log(f"calibration: converting {src} with 8-bit blocks into {model} (removed when the conversion is written)")
        try:
            convert_source(model)
        except ConvertError as e:
            raise UserError(f"the calibration model: {e}") from None
    elif not (model / "colibri.json").is_file():
        raise UserError(f"--calibrate-model {model}: no colibri.json; give a container converted from {src}")
    ids = tokenize(model, text)
    if not ids:
        raise UserError(f"--calibrate {text}: the text holds no tokens")
    ids_file = work / "ids.txt"
    ids_file.write_text(",".join(map(str, ids)))
    chunks = -(-len(ids) // CHUNK)
    log(f"calibration: {len(ids)} tokens of {text} in {chunks} chunk(s) of at most {CHUNK} through {model}")
    part = stats.with_name(stats.name + ".part")
    cmd = [str(engine_client.ensure_built()), "calibrate", "--model", str(model), "--ids-file", str(ids_file),
           "--out", str(part), "--chunk", str(CHUNK), "--ctx", str(min(CHUNK, len(ids)))]
    r = subprocess.run(cmd + launch_opts.engine_args(args), env=engine_client.engine_env(None))  # its progress: stderr
    if r.returncode != 0:
        part.unlink(missing_ok=True)
        raise UserError(f"calibration failed (the engine exited with code {r.returncode}; its message is above)")
    part.rename(stats)
    return stats


def tokenize(model, text):
    return tokenize_file(model, text)  # the same ids `coli perplexity` scores


def remove_work(out, log):
    work = work_dir(out)
    if work.exists():
        shutil.rmtree(work)
        log(f"calibration: removed {work}")

