"""`coli convert`: HF safetensors checkpoint -> colibri container (stdlib only).

Python plans: it reads the source headers, maps every source tensor to its output tensor and
storage type, lays out the output shards and writes their headers. The engine binary
(`colibri convert-jobs`) moves and re-encodes the bytes, one chunk of rows at a time, so peak
memory stays near 3 x 32 MiB whatever the model size.

Output shard k holds the tensors anchored in source shard k; each routed expert's gate, up and
down projections are adjacent, so one read fetches the whole expert. A shard is written as
NAME.partial and renamed when complete; `.coli_convert.json` records finished shards and the
settings, so an interrupted conversion resumes and a conversion with other settings into the
same directory is refused. colibri.json is written last: its presence means complete.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import family_registry
from colibri.convert import default_chat_template, imatrix, mtp_spec
from colibri.convert import tensor_types as tensor_classes  # the name tensor_types is the overrides
from colibri.checksum import sha256_file
from colibri.model import shard_sums
from colibri.limits import DENSE_STORAGE, EXPERT_STORAGE, LOWBIT_BLOCKS, STORAGE_DTYPE, fitted_storage, row_bytes
from colibri.errors import ConvertError
from colibri.convert.safetensors_io import SafetensorsError, build_header, read_header
from version import VERSION
from colibri.family import normalize as family_normalize
from colibri.family import parts as family_parts
from colibri.family import specs as family_specs
from colibri import engine_client

FORMAT_VERSION = 1
EXPERT_CHOICES, DENSE_CHOICES = EXPERT_STORAGE, DENSE_STORAGE
SOURCE_DTYPES = ("F32", "F16", "BF16", "F8_E4M3")  # F8_E4M3: block-FP8, with its weight_scale_inv
INDEX_DTYPES = ("I64", "I32")  # integer tables (DeepSeek-V4's tid2eid), stored as f32 (exact below 2^24)
COPIED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                "special_tokens_map.json", "chat_template.jinja")
STATE_FILE = ".coli_convert.json"
# Source tensors that carry no weights the engine needs.
IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
ELEM = {"F32": 4, "BF16": 2, "F16": 2}  # bytes per value of the float source dtypes


def source_files(src):
    """Returns the list of source safetensors files of a checkpoint directory."""
    index = src / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise ConvertError(f"{index}: unreadable index ({e})") from None
        names = sorted(set(weight_map.values()))
        for n in names:
            if "/" in n or not (src / n).exists():
                raise ConvertError(f"{index} names shard '{n}', which is missing")
        return [src / n for n in names]
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ConvertError(f"{src}: no *.safetensors files (a GGUF file or a PyTorch .bin checkpoint? "
                           "only safetensors checkpoints are supported)")
    return files


class Planner:
    """Maps source tensors to output tensors for one architecture."""

    def __init__(self, arch, experts_q, dense_q, tensor_types=None):
        self.arch, self.experts_q, self.dense_q = arch, experts_q, dense_q
        self.tensor_types = tensor_types or {}  # --tensor-type: class -> storage (colibri/convert/tensor_types.py)
        self.outputs = []   # dicts: name, klass, qtype, rows, cols, parts[(file, offset, dtype, rows)], anchor, order
        self.used = set()
        self.fallbacks = {}  # (asked, stored) -> tensors whose rows the asked block type does not divide

    def add(self, name, klass, rows, cols, parts, anchor, order):
        asked = {"expert": self.experts_q, "dense": self.dense_q, "f32": "f32"}[klass]
        override = klass != "f32" and tensor_classes.type_for(name, self.tensor_types)
        asked = override or asked
        qtype = fitted_storage(asked, cols)
        if qtype != asked:
            self.fallbacks[asked, qtype] = self.fallbacks.get((asked, qtype), 0) + 1
        self.outputs.append(dict(name=name, klass=klass, qtype=qtype, rows=rows, cols=cols, parts=parts, anchor=anchor,
                                 order=order, override=bool(override)))


def plan_tensors(arch, tensors, experts_q, dense_q, tensor_types=None):
    """tensors: name -> dict(file, dtype, shape, offset). Returns the Planner with every output."""
    p = Planner(arch, experts_q, dense_q, tensor_types)
    H, V, L = arch["hidden_size"], arch["vocab_size"], arch["num_layers"]

    def take(name, shape):
        t = tensors.get(name)
        if t is None:
            raise ConvertError(f"source checkpoint lacks tensor '{name}'")
        if list(t["shape"]) != list(shape):
            raise ConvertError(f"source tensor '{name}' has shape {t['shape']}, the config implies {list(shape)}")
        if t["dtype"] not in SOURCE_DTYPES and not (name.endswith(".tid2eid") and t["dtype"] in INDEX_DTYPES):
            raise ConvertError(f"source tensor '{name}' is {t['dtype']}; supported source dtypes: {', '.join(SOURCE_DTYPES)}")
        p.used.add(name)
        if t["dtype"] == "F8_E4M3":
            p.used.add(t["scale"]["name"])
        return t

    def part(t, offset, rows):
        """One source slice of whole rows; an FP8 one carries its block scale (rows from row 0)."""
        if t["dtype"] != "F8_E4M3":
            return (t["file"], offset, t["dtype"], rows)
        s = t["scale"]
        return (t["file"], offset, t["dtype"], rows, (s["file"], s["offset"], s["dtype"], s["block"][0], s["block"][1], 0))

    def whole(name, klass, shape, order):
        t = take(name, shape)
        rows, cols = (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])
        p.add(name, klass, rows, cols, [part(t, t["offset"], rows)], t["file"], order)

    # Output names come from the layer specs (family_registry), so the converter and the
    # engine agree on them by construction; only the shapes and storage classes are ours.
    trunk = family_specs.trunk_spec(arch)
    whole(trunk["embed"], "dense", [V, H], (0,))
    whole(trunk["final_norm"]["tensors"]["weight"], "f32", [H], (0,))
    if "hc_head" in trunk:  # DeepSeek-V4's final collapse of the residual streams
        for key, shape in family_parts.hc_shapes(trunk["hc_head"], H).items():
            whole(trunk["hc_head"]["tensors"][key], "f32", shape, (L + 1,))
    if arch["tie_word_embeddings"]:
        if "lm_head.weight" in tensors:
            p.used.add("lm_head.weight")  # a tied checkpoint may still carry a copy
    else:
        whole(trunk["lm_head"], "dense", [V, H], (L + 1,))
    def rows_of(name, klass, rows, cols, pieces, order):
        """One output gathered from row ranges (rows of `cols` values) of one or more source tensors."""
        parts, anchor = [], None
        for src, shape, ranges in pieces:
            t = take(src, shape)
            if t["dtype"] not in ELEM:
                raise ConvertError(f"source tensor '{src}' is {t['dtype']}; this layout needs F32, F16 or BF16")
            anchor = anchor or t["file"]
            parts += [(t["file"], t["offset"] + r0 * cols * ELEM[t["dtype"]], t["dtype"], n) for r0, n in ranges]
        p.add(name, klass, rows, cols, parts, anchor, order)

    for l, spec in enumerate(family_specs.layer_specs(arch) + planned_mtp_layers(arch, tensors)):
        o = (l + 1,)
        for norm in ("attn_norm", "mlp_norm"):
            whole(spec[norm]["tensors"]["weight"], "f32", [H], o)
        for hc in ("attn_hc", "mlp_hc"):  # DeepSeek-V4's hyper-connections
            if hc in spec:
                for key, shape in family_parts.hc_shapes(spec[hc], H).items():
                    whole(spec[hc]["tensors"][key], "f32", shape, o)
        special = family_parts.attn_outputs(spec["attn"], arch, f"model.layers.{l}", H,
                                            lambda n: list(tensors[n]["shape"]) if n in tensors else None)
        for out in special or ():
            rows_of(*out, o)
        if not special:  # gated DeltaNet / KDA / gated-q layers are gathered above
            shapes = family_parts.attn_shapes(spec["attn"], H)
        for key, name in ({} if special else spec["attn"]["tensors"]).items():
            whole(name, "dense" if len(shapes[key]) == 2 else "f32", shapes[key], o)
        for name, shape, klass in family_parts.compress_tensors(spec["attn"], H):  # DeepSeek-V4's compressors
            whole(name, klass, shape, o)
        if "tensors" in spec["attn"].get("indexer", {}):  # DSA lightning indexer: dense trunk
            ix = spec["attn"]["indexer"]
            ishapes = family_parts.indexer_shapes(ix, H, spec["attn"]["q_lora_rank"])
            for key, name in ix["tensors"].items():
                whole(name, "dense" if len(ishapes[key]) == 2 else "f32", ishapes[key], o)
        mlp = spec["mlp"]
        if mlp["kind"] == "dense":
            I = mlp["width"]
            shapes = {"gate": [I, H], "up": [I, H], "down": [H, I], "gate_bias": [I], "up_bias": [I], "down_bias": [H]}
            for key, name in mlp["tensors"].items():
                whole(name, "dense" if len(shapes[key]) == 2 else "f32", shapes[key], o)
            continue
        E, I = mlp["experts"], mlp["width"]
        whole(mlp["router"]["tensors"]["weight"], "f32", [E, H], o)
        if "bias" in mlp["router"]["tensors"]:  # selection-only correction bias (sigmoid_group)
            whole(mlp["router"]["tensors"]["bias"], "f32", [E], o)
        if "tid2eid" in mlp["router"]["tensors"]:  # hash routing: each token's top-k experts
            whole(mlp["router"]["tensors"]["tid2eid"], "f32", [V, mlp["top_k"]], o)
        if "shared" in mlp:  # shared experts: dense trunk, resident
            S = mlp["shared"]["width"]
            for key, name in mlp["shared"]["tensors"].items():
                whole(name, "dense", [H, S] if key == "down" else [S, H], o)
            if "gate" in mlp["shared"]:  # Qwen2-MoE's sigmoid gate on the shared expert
                whole(mlp["shared"]["gate"]["tensors"]["weight"], "f32", [1, H], o)
        names = mlp["expert_tensors"]
        pre = f"model.layers.{l}"
        plan_experts = family_parts.expert_planner(arch.get("_family"))  # a layout of the family's own
        if plan_experts:
            plan_experts(p, tensors, take, pre, names, E, I, H)
            continue
        fused = f"{pre}.mlp.experts.gate_up_proj"  # transformers' fused source layout
        if fused in tensors:
            gu = take(fused, [E, 2 * I, H])
            dn = take(f"{pre}.mlp.experts.down_proj", [E, H, I])
            if "F8_E4M3" in (gu["dtype"], dn["dtype"]):
                raise ConvertError(f"{fused}: block-FP8 fused expert tensors are not supported (only per-expert ones)")
            gsz, dsz = {"F32": 4}.get(gu["dtype"], 2), {"F32": 4}.get(dn["dtype"], 2)
        for e in range(E):
            eo = (l + 1, e)
            out = {k: v.replace("{e}", str(e)) for k, v in names.items()}
            if fused in tensors:
                # gate_up_proj[e] is [2I, H]: rows 0..I are gate, I..2I are up (chunk(2) order)
                base = gu["offset"] + e * 2 * I * H * gsz
                p.add(out["gate"], "expert", I, H, [(gu["file"], base, gu["dtype"], I)], gu["file"], eo)
                p.add(out["up"], "expert", I, H, [(gu["file"], base + I * H * gsz, gu["dtype"], I)], gu["file"], eo)
                p.add(out["down"], "expert", H, I, [(dn["file"], dn["offset"] + e * H * I * dsz, dn["dtype"], H)],
                      gu["file"], eo)
            else:
                g = tensors.get(out["gate"]) or take(out["gate"], [I, H])
                for proj, shape in (("gate", [I, H]), ("up", [I, H]), ("down", [H, I])):
                    src = fp4_part(p, tensors, out[proj], *shape)  # DeepSeek-V4 releases: FP4 experts
                    if src is None:
                        t = take(out[proj], shape)
                        src = part(t, t["offset"], shape[0])
                    p.add(out[proj], "expert", shape[0], shape[1], [src], g["file"], eo)
    p.mtp = keep_mtp_layers(p, tensors, L, take, part)
    # a family may ship weights its transformers model never loads (MiMo-V2-Flash's model.mtp.*)
    skip = family_registry.FAMILIES.get(arch.get("_family"), {}).get("ignored_tensors")
    unused = [n for n in tensors if n not in p.used and not IGNORED.search(n) and not (skip and re.search(skip, n))]
    if unused:
        more = f" (and {len(unused) - 5} more)" if len(unused) > 5 else ""
        raise ConvertError(f"source tensors the {arch.get('_family', 'model')} layout does not use: "
                           f"{', '.join(sorted(unused)[:5])}{more}; refusing to drop weights silently")
    return p


FP4_DTYPES = ("I8", "U8", "F4")  # two e2m1 values per byte, the low nibble first (F4 shapes count values)


def is_fp4(tensors, name):
    return tensors.get(name, {}).get("dtype") in FP4_DTYPES and name + "_scale_inv" in tensors


def fp4_part(p, tensors, name, rows, cols):
    """An FP4 expert weight (DeepSeek-V4 releases: NAME [rows, cols/2] packed e2m1 and its
    NAME_scale_inv [rows, cols/32] e8m0 power-of-two scales, the MXFP4 layout) as one MXFP4 source
    part, or None when the weight is not FP4."""
    if not is_fp4(tensors, name):
        return None
    t, s = tensors[name], tensors[name + "_scale_inv"]
    packed = [rows, cols] if t["dtype"] == "F4" else [rows, cols // 2]
    if cols % 32 or list(t["shape"]) != packed or list(s["shape"]) != [rows, cols // 32] \
            or s["dtype"] not in ("F8_E8M0", "U8"):
        raise ConvertError(f"FP4 tensor '{name}' is {t['dtype']} {t['shape']} with {s['dtype']} {s['shape']} scales; "
                           f"[{rows}, {cols}] needs {packed} packed values and [{rows}, {cols // 32}] F8_E8M0 scales")
    p.used.update((name, name + "_scale_inv"))
    return (t["file"], t["offset"], "MXFP4", rows, ("mxfp4", s["file"], s["offset"], 1))


def planned_mtp_layers(arch, tensors):
    """The MTP layers' specs where the family plans them as trunk layers (arch mtp_layer_attn:
    their attention needs the trunk's gathers, as Qwen3.5's split q_proj) and the checkpoint
    holds them (a fine-tune saved without its head keeps the config's count), else none: the
    other families' MTP layers are kept as they are by keep_mtp_layers."""
    n = int(arch.get("num_nextn_predict_layers") or 0)
    if not n or not arch.get("mtp_layer_attn"):
        return []
    specs = mtp_spec.mtp_layer_specs(arch, n)
    return specs if all(s["attn_norm"]["tensors"]["weight"] in tensors for s in specs) else []


MTP_RE = re.compile(r"^model\.layers\.(\d+)\.(?:.*\.experts\.(\d+)\.)?")


def keep_mtp_layers(p, tensors, L, take, part):
    """Multi-token-prediction layers (DeepSeek-V3, GLM-4.5: the config's num_nextn_predict_layers,
    stored at layer index L and up) are kept in the container under their own names (a layer
    planned_mtp_layers took as a trunk layer leaves only its MTP-only parts here), and the
    manifest's `mtp` entries (mtp_spec.py) tell the engine how to run them. Any other extra layer stays an
    unused tensor (refused). Returns their layer indices (the manifest's mtp_layers)."""
    layers, n_mtp = set(), int(p.arch.get("num_nextn_predict_layers") or 0)
    for name, t in tensors.items():
        m = MTP_RE.match(name)
        if not m or not L <= int(m.group(1)) < L + n_mtp or name in p.used or name.endswith("_scale_inv"):
            continue
        t = take(name, t["shape"])
        shape, l = t["shape"], int(m.group(1))
        rows = 1 if len(shape) == 1 else shape[0] if len(shape) == 2 else shape[0] * shape[1]
        cols = shape[-1]
        router = name.endswith(".mlp.gate.weight")  # f32, as the layers' routers
        klass = "f32" if len(shape) == 1 or router else "expert" if m.group(2) or len(shape) == 3 else "dense"
        order = (l + 2, int(m.group(2))) if m.group(2) else (l + 2,)
        p.add(name, klass, rows, cols, [part(t, t["offset"], rows)], t["file"], order)
        layers.add(l)
    return sorted(layers)


def attach_fp8_scales(cfg, tensors):
    """Block-FP8 checkpoints (DeepSeek-V3, GLM releases): every F8_E4M3 weight has a
    NAME_scale_inv of [ceil(rows/br), ceil(cols/bc)] (quantization_config.weight_block_size,
    default 128 x 128); the converter dequantizes with it before re-quantizing."""
    qc = cfg.get("quantization_config") or {}
    block = qc.get("weight_block_size") or [128, 128]
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ConvertError(f"config.json quantization_config.weight_block_size {block!r} is not two positive integers")
    for name, t in tensors.items():
        if t["dtype"] != "F8_E4M3":
            continue
        sname = name + "_scale_inv"
        s = tensors.get(sname)
        if s is None or len(t["shape"]) != 2:
            raise ConvertError(f"FP8 tensor '{name}' has no {sname} block scale (a 2-D weight and its scale are needed)")
        want = [-(-t["shape"][0] // block[0]), -(-t["shape"][1] // block[1])]
        if list(s["shape"]) != want or s["dtype"] not in ("F32", "BF16", "F8_E8M0"):
            raise ConvertError(f"'{sname}' is {s['dtype']} {s['shape']}; {block[0]}x{block[1]} blocks of {name} "
                               f"{t['shape']} need F32, BF16 or F8_E8M0 {want}")
        t["scale"] = dict(s, name=sname, block=block)


def written_names(planner):
    return {o["name"] for o in planner.outputs}


def block_specs(arch, planner):
    """The manifest's trunk and per-layer block specs (family_registry), checked against the
    tensors this conversion writes: the engine loads exactly the names the specs give."""
    trunk, layers = family_specs.trunk_spec(arch), family_specs.layer_specs(arch)
    written = written_names(planner)
    names = [trunk["embed"], trunk["lm_head"], trunk["final_norm"]["tensors"]["weight"]]
    for spec in layers:
        mtp_spec.spec_tensor_names(spec, names)
    missing = sorted(set(names) - written)
    if missing:
        raise ConvertError(f"the layer specs name tensors this conversion does not write: {', '.join(missing[:5])}")
    return trunk, layers


def layout_shards(planner, src_files):
    """Groups outputs by anchor source file and orders each shard: f32, then 2-byte, then 1-byte
    storage (keeps every tensor aligned to its element size), experts gate/up/down adjacent."""
    size_rank = {"F32": 0, "BF16": 1, "F16": 1, "U8": 2}
    kind_rank = {"gate_proj": 0, "up_proj": 1, "down_proj": 2}
    shards = []
    n = len(src_files)
    for k, f in enumerate(src_files):
        outs = [o for o in planner.outputs if o["anchor"] == f]
        if not outs:
            continue
        outs.sort(key=lambda o: (size_rank[STORAGE_DTYPE[o["qtype"]]], o["order"],
                                 kind_rank.get(o["name"].split(".")[-2], 9), o["name"]))
        shards.append((f"model-{k + 1:05d}-of-{n:05d}.safetensors", outs))
    return shards


def engine_binary():
    try:
        return engine_client.release_engine()
    except engine_client.EngineError as e:
        raise ConvertError(e.message) from None


def write_shard(out, fname, outs, log):
    entries, infos = [], {}
    for o in outs:
        rb = row_bytes(o["qtype"], o["cols"])
        dtype = STORAGE_DTYPE[o["qtype"]]
        shape = [o["rows"], rb] if dtype == "U8" else ([o["cols"]] if o["rows"] == 1 else [o["rows"], o["cols"]])
        entries.append((o["name"], dtype, shape, o["rows"] * rb))
        infos[o["name"]] = [o["qtype"], o["rows"], o["cols"]]
    metadata = {"format": "colibri", "colibri.tensors": json.dumps(infos, separators=(",", ":"))}
    header, offsets, data_len = build_header(entries, metadata)
    partial = out / (fname + ".partial")
    with open(partial, "wb") as f:
        f.write(header)
        f.truncate(len(header) + data_len)
    jobs = []
    for o in outs:
        dst = len(header) + offsets[o["name"]]
        rb = row_bytes(o["qtype"], o["cols"])
        for (src, off, dtype, rows, *scale) in o["parts"]:
            extra = "".join(f"\t{x}" for x in scale[0]) if scale else ""  # block-FP8: its scale tensor
            if "importance" in o:  # --imatrix: the columns' weights (imatrix.py)
                extra += "\timportance\t{}\t{}".format(*o["importance"])
            jobs.append(f"{src}\t{off}\t{dtype}\t{rows}\t{o['cols']}\t{partial}\t{dst}\t{o['qtype']}{extra}\n")
            dst += rows * rb
    with tempfile.NamedTemporaryFile("w", suffix=".jobs", delete=False) as jf:
        jf.writelines(jobs)
    try:
        proc = subprocess.Popen([str(engine_binary()), "convert-jobs", jf.name], stderr=subprocess.PIPE, text=True)
        errors = []
        for line in proc.stderr:
            if line.startswith("PROGRESS "):
                done, total = line.split()[1:3]
                log(f"\r  {fname}: {done}/{total} tensors", end="")
            else:
                errors.append(line.rstrip())
        rc = proc.wait()
    finally:
        os.unlink(jf.name)
    log("")
    if rc:
        raise ConvertError(f"writing {fname} failed: {' '.join(errors) or f'engine exit code {rc}'}")
    os.replace(partial, out / fname)


def default_experts(mxfp4_source):
    """Routed-expert storage when --experts is not given: MXFP4 experts stay MXFP4 (measured on
    the gpt-oss oracle against the MXFP4 model: mean KL 7e-8 kept, 1.6e-2 re-quantized to q4),
    everything else q4."""
    return "mxfp4" if mxfp4_source else "q4"


def check_storage(experts, dense, types):
    """The storage arguments of a conversion, or ConvertError saying which is not one."""
    if experts is not None and experts not in EXPERT_CHOICES:
        raise ConvertError(f"--experts must be one of {', '.join(EXPERT_CHOICES)}")
    if dense not in DENSE_CHOICES:
        raise ConvertError(f"--dense must be one of {', '.join(DENSE_CHOICES)}")
    bad = {c: t for c, t in (types or {}).items() if c not in tensor_classes.CLASSES or t not in DENSE_CHOICES}
    if bad:
        raise ConvertError(f"--tensor-type {bad}: classes are {', '.join(tensor_classes.CLASSES)}, types "
                           f"{', '.join(DENSE_CHOICES)}")


def storage_settings(experts, dense, types):
    """The storage part of the settings a resumed conversion must repeat (and of the manifest's
    quant): --tensor-type only where given, so a conversion without it reads as before."""
    return {"experts": experts, "dense": dense, **({"tensor_types": dict(sorted(types.items()))} if types else {})}


def convert(src, out, experts=None, dense="q8", log=print, imatrix=None, tensor_types=None):
    src, out = Path(src), Path(out)
    check_storage(experts, dense, tensor_types)
    if not (src / "config.json").is_file():
        raise ConvertError(f"{src}: no config.json; give the directory of a Hugging Face checkpoint")
    try:
        cfg = json.loads((src / "config.json").read_text())
        family, arch = family_normalize.normalize_arch(cfg)
    except ValueError as e:
        raise ConvertError(f"{src / 'config.json'}: {e}") from None
    files = source_files(src)
    tensors = {}
    for f in files:
        try:
            header, _ = read_header(f)
        except SafetensorsError as e:
            raise ConvertError(str(e)) from None
        for name, t in header.items():
            if name in tensors:
                raise ConvertError(f"tensor '{name}' appears in two source shards")
            tensors[name] = dict(t, file=str(f.resolve()))
    try:
        tensors = family_parts.hf_source_tensors(family, tensors, arch, log)
    except ValueError as e:
        raise ConvertError(str(e)) from None
    attach_fp8_scales(cfg, tensors)
    if experts is None:
        experts = default_experts(any(n.endswith(".experts.gate_up_proj_blocks") or (".experts." in n and is_fp4(tensors, n))
                                      for n in tensors))
    arch["_family"] = family
    planner = plan_tensors(arch, tensors, experts, dense, tensor_types)
    del arch["_family"]
    trunk, layers = block_specs(arch, planner)
    shards = layout_shards(planner, [str(f.resolve()) for f in files])
    settings = {"converter_version": VERSION, "format_version": FORMAT_VERSION,
                **storage_settings(experts, dense, tensor_types),
                "source": {f.name: [f.stat().st_size, int(f.stat().st_mtime)] for f in files}}
    calibration = calibrate(settings, planner, family, imatrix)
    state = start_conversion(out, settings, len(shards), log)
    if state is None:
        return out
    narrowed = sorted({f"{parts[0][2]} -> {o['qtype']}" for o in planner.outputs for parts in [o["parts"]]
                       if o["qtype"] == "bf16" and parts[0][2] in ("F32", "F16")})
    if narrowed:
        log(f"note: bf16 storage rounds wider source weights ({', '.join(narrowed)}); use f32 to keep them exactly")
    log_fallbacks(planner, log)
    log(f"converting {family_registry.FAMILIES[family]['display']} ({len(tensors)} source tensors, "
        f"{len(files)} shard(s)): {storage_line(experts, dense, tensor_types)}")
    write_calibrated_shards(out, shards, state, calibration, log)
    for name in COPIED_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    default_chat_template.write_default(out, family, log)
    log("checksumming sources")
    write_manifest(out, family=family, arch=arch, trunk=trunk, layers=layers, experts=experts, dense=dense,
                   tensor_types=tensor_types,
                   bos=token_id(cfg, src, "bos_token_id"), eos=eos_ids(cfg, src, family), shards=shards,
                   source={"files": {f.name: sha256_file(f) for f in files}, "model_type": cfg.get("model_type")},
                   mtp_layers=planner.mtp, mtp=mtp_spec.mtp_specs(arch, planner.mtp, written_names(planner), log), log=log)
    log(f"wrote {out}")
    return out


def calibrate(settings, planner, family, imatrix_path):
    """--imatrix matched to the planned outputs (imatrix.py), its checksum in the settings a
    resumed conversion must repeat; None without one."""
    if imatrix_path is None:
        return None
    fingerprint, matched = imatrix.plan(imatrix_path, planner, family)
    settings["imatrix"] = fingerprint
    return matched


def write_calibrated_shards(out, shards, state, calibration, log):
    """write_missing_shards, with the imatrix's vectors in a scratch file while the shards need it."""
    if calibration is not None:
        imatrix.write_scratch(out, calibration, log)
    try:
        write_missing_shards(out, shards, state, log)
    finally:
        (out / imatrix.SCRATCH).unlink(missing_ok=True)


def log_fallbacks(planner, log):
    """Says which tensors did not get the asked block type because their rows are not whole blocks."""
    for (asked, stored), n in sorted(planner.fallbacks.items()):
        log(f"note: {n} tensor(s) have rows that are not whole {LOWBIT_BLOCKS[asked][0]}-element {asked} blocks; "
            f"stored as {stored}")


def write_manifest(out, *, family, arch, trunk, layers, experts, dense, bos, eos, shards, source, quant_extra=None,
                   mtp_layers=None, mtp=None, log=None, tensor_types=None):
    """colibri.json, for every converter: written last and renamed into place, so its presence
    means the container is complete (docs/container.md)."""
    manifest = {
        "format": "colibri-container",
        "format_version": FORMAT_VERSION,
        "converter_version": VERSION,
        "family": family,
        "arch": arch,
        "trunk": trunk,
        "layers": layers,
        "quant": {**storage_settings(experts, dense, tensor_types),
                  "embed": (tensor_types or {}).get("embed", dense), "lm_head": (tensor_types or {}).get("lm_head", dense),
                  "norms": "f32", "router": "f32", "biases": "f32",
                  "q8": "blocks of 32, f16 scale", "q4": "blocks of 32, f16 scale + f16 min",
                  "mxfp4": "blocks of 32, e8m0 scale + e2m1 nibbles",
                  "q6": "blocks of 32, f16 scale + 4-bit and 2-bit planes", **(quant_extra or {})},
        "bos_token_id": bos,
        "eos_token_ids": eos,
        "shards": [fname for fname, _ in shards],
        "source": source,
        shard_sums.KEY: shard_sums.record(str(out), [fname for fname, _ in shards], log),
    }
    if mtp_layers:  # kept; run as drafters (--draft mtp) where `mtp` describes them
        manifest["mtp_layers"] = mtp_layers
    if mtp:
        manifest["mtp"] = mtp
    tmp = out / "colibri.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / "colibri.json")


def start_conversion(out, settings, n_shards, log):
    """Opens OUT for a conversion with these settings: returns the state to continue (finished
    shards are skipped), or None when OUT already holds this exact conversion. Refuses a
    directory that holds another conversion or a model this one did not make."""
    if out.exists() and not out.is_dir():
        raise ConvertError(f"{out} exists and is not a directory; give a new or empty directory as the output")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConvertError(f"cannot create the output directory {out}: {e.strerror or e}") from None
    state_path = out / STATE_FILE
    state = {"settings": settings, "done": []}
    if state_path.exists():
        prev = read_state(state_path, out)
        if prev.get("settings") != settings:
            raise ConvertError(f"{out} holds a conversion with other settings ({describe(prev.get('settings'))}); "
                               f"this one is ({describe(settings)}). Use another output directory or delete it.")
        if (out / "colibri.json").exists():
            log(f"{out}: already converted with these settings")
            return None
        state = prev
        log(f"resuming: {len(state['done'])}/{n_shards} shards already written")
    elif (out / "colibri.json").exists() or any(out.glob("*.safetensors")):
        raise ConvertError(f"{out} already holds a model not made by this conversion; use an empty directory")
    elif any(out.iterdir()):  # never scatter shards among someone's files
        names = sorted(x.name for x in out.iterdir())
        raise ConvertError(f"{out} is not empty ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) and holds "
                           "no conversion to resume; give a new or empty directory as the output")
    state_path.write_text(json.dumps(state))
    return state


def read_state(state_path, out):
    """The resume record of an interrupted conversion; a damaged one is refused, not guessed at."""
    try:
        prev = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        prev, why = None, str(e)
    else:
        why = "it is not an object with settings and a list of finished shards"
    if not (isinstance(prev, dict) and isinstance(prev.get("settings"), dict) and isinstance(prev.get("done"), list)
            and all(isinstance(x, str) for x in prev["done"])):
        raise ConvertError(f"{state_path} (the resume record of an interrupted conversion) is damaged ({why}); "
                           f"delete the directory {out} and convert again")
    return prev


def write_missing_shards(out, shards, state, log):
    """Writes every shard not finished yet, recording each one as it completes."""
    for fname, outs in shards:
        if fname in state["done"] and (out / fname).exists():
            continue
        write_shard(out, fname, outs, log)
        state["done"].append(fname)
        (out / STATE_FILE).write_text(json.dumps(state))


def describe(s):
    if not s:
        return "unknown"
    return f"{storage_line(s.get('experts'), s.get('dense'), s.get('tensor_types'))}, converter {s.get('converter_version')}"


def storage_line(experts, dense, types=None):
    """'experts q4, dense q8' and the --tensor-type overrides: what a conversion stores."""
    return ", ".join([f"experts {experts}", f"dense {dense}"] + [f"{c} {t}" for c, t in sorted((types or {}).items())])


def _generation_config(src):
    p = src / "generation_config.json"
    try:
        return json.loads(p.read_text()) if p.exists() else {}
    except ValueError:
        return {}


def token_id(cfg, src, key):
    v = _generation_config(src).get(key, cfg.get(key))
    return v if isinstance(v, int) else -1


def eos_ids(cfg, src, family=None):
    v = _generation_config(src).get("eos_token_id", cfg.get("eos_token_id"))
    ids = [v] if isinstance(v, int) else [x for x in v if isinstance(x, int)] if isinstance(v, list) else []
    return ids + [i for i in family_stop_ids(src, family) if i not in ids]


def family_stop_ids(src, family):
    """Ids of the registry's end-of-generation tokens for the family (gpt-oss: <|return|>, <|call|>),
    so an answer ends on them even where generation_config.json lists fewer."""
    names = family_registry.FAMILIES.get(family, {}).get("stop_tokens") or ()
    if not names:
        return []
    try:
        added = json.loads((src / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
    except (OSError, ValueError, AttributeError):
        return []
    ids = {t.get("content"): t.get("id") for t in added if isinstance(t, dict)}
    return [ids[n] for n in names if isinstance(ids.get(n), int)]
