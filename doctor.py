"""`coli doctor [--deep] [--json]`: read-only readiness checks, each pass / warn / fail with a fix.

Exit code: 0 when everything passes, 1 when the worst result is a warning, 2 for a failure.
--deep also walks every tensor of every shard (offsets, dtypes, shapes, overlaps, alignment,
the colibri.tensors storage entries, the expert layout), checks every shard's bytes against the
checksums recorded at conversion and loads the model in the engine.
"""
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from colibri.engine_status import engine_status
from colibri.errors import UserError
from colibri.model.paths import check_arch, model_arg, model_path
from colibri.family import specs as family_specs
from colibri import engine_client
from colibri import launch_opts
from colibri.limits import default_batch
from colibri.model import container_scan
from colibri.model import container_scan as cs
from colibri.model import shard_sums
from colibri.model import store as model_store
import family_registry
import resource_plan

HELP = "check that the engine, the machine and a model are ready (read-only)"
DESCRIPTION = """Read-only readiness checks with a fix for each problem:
engine built, model directory complete, shards consistent with colibri.json, tokenizer and chat
template present, family supported, RAM and disk sufficient, O_DIRECT support, open-file limit.
--deep walks every tensor (offsets, dtypes, shapes, overlaps, storage entries, expert layout),
checks the shards' bytes against the checksums recorded at conversion and loads the model in
the engine. Exit code: 0 all passed, 1 warnings, 2 failures."""

ROOT = Path(__file__).resolve().parent
RANK = {"pass": 0, "warn": 1, "fail": 2}
MAX_LISTED = 8  # problems listed per check; the rest are counted


class Report:
    def __init__(self):
        self.checks = []

    def add(self, name, status, detail, fix=None):
        self.checks.append({"name": name, "status": status, "detail": detail, "fix": fix})
        return status

    def many(self, name, problems, ok_detail, fix, status="fail"):
        if not problems:
            return self.add(name, "pass", ok_detail)
        shown = problems[:MAX_LISTED]
        more = f"\n(and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
        return self.add(name, status, "\n".join(shown) + more, fix)

    @property
    def worst(self):
        return max((c["status"] for c in self.checks), key=RANK.get, default="pass")


# ---------------------------------------------------------------- machine and engine

def check_engine(rep):
    st = engine_status()
    if not st["built"]:
        return rep.add("engine", "fail", f"{st['path']} is not built", "run `make` (or `coli build`) in the colibri directory")
    if st["version"] is None:
        return rep.add("engine", "fail", f"{st['path']} does not run: {st['error']}", "rebuild it: `coli build --clean`")
    if st["version"] != st["expected_version"]:
        return rep.add("engine", "warn", f"the engine reports version {st['version']}, the launcher is "
                       f"{st['expected_version']}", "rebuild it: `make` (or `coli build`)")
    if st["stale"]:
        return rep.add("engine", "warn", f"colibri {st['version']}, but {st['stale']} changed after the last build",
                       "rebuild it: `make` (or `coli build`)")
    return rep.add("engine", "pass", f"colibri {st['version']} built; kernels: {st['kernels']}")


def check_open_files(rep, n_shards):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n_shards + 64  # every shard stays open (mapped), plus stdio, pipes, KV files
    if soft == resource.RLIM_INFINITY or soft >= need:
        return rep.add("open files", "pass", f"limit {soft if soft != resource.RLIM_INFINITY else 'unlimited'} "
                       f"(needs about {need})")
    status = "fail" if hard != resource.RLIM_INFINITY and hard < need else "warn"
    return rep.add("open files", status, f"the open-file limit is {soft} but about {need} are needed",
                   f"raise it before starting: `ulimit -n {max(need, 4096)}`"
                   + ("" if status == "warn" else " (the hard limit must be raised by an administrator)"))


def check_overcommit(rep, mem):
    if mem.get("overcommit") == 2:
        rep.add("overcommit", "warn", "vm.overcommit_memory=2 (strict): mapping a model larger than the commit "
                "limit can fail", "use the default heuristic: `sysctl vm.overcommit_memory=0`")


# ---------------------------------------------------------------- model

def check_model_dir(rep, model):
    """Returns the manifest, or None when the model cannot be checked further."""
    d = Path(model)
    if not d.exists():
        pulled = ", ".join(model_store.list_models()) or "none"
        rep.add("model", "fail", f"{d}: no such directory or pulled model (pulled: {pulled})",
                "pass --model DIR of a converted container, or a name `coli pull NAME` has fetched")
        return None
    if not d.is_dir():
        rep.add("model", "fail", f"{d} is a file, not a container directory", "pass the directory holding colibri.json")
        return None
    try:
        man = container_scan.read_manifest(d)
    except container_scan.ContainerError as e:
        is_hf = (d / "config.json").is_file() and not (d / "colibri.json").exists()
        fix = (f"coli convert {d} OUT, then use --model OUT" if is_hf else
               "re-run `coli convert SRC OUT` for this model" if (d / "colibri.json").exists() else
               "pass the directory of a converted model (`coli convert SRC OUT` makes one)")
        rep.add("model", "fail", str(e), fix)
        return None
    try:
        check_arch(d)
    except UserError as e:
        rep.add("model", "fail", str(e), "re-run `coli convert SRC OUT` for this model")
        return None
    rep.add("model", "pass", f"{d}: colibri container, format {man['format_version']}, "
            f"converter {man.get('converter_version')}")
    return man


def check_family(rep, man):
    fam = man.get("family")
    if fam not in family_registry.FAMILIES:
        return rep.add("family", "fail", f"family '{fam}' is not one this colibri supports "
                       f"({', '.join(sorted(family_registry.FAMILIES))})",
                       "update colibri, or convert a supported checkpoint")
    engine_list = engine_families()
    if engine_list is not None and fam not in engine_list:
        return rep.add("family", "fail", f"the launcher knows '{fam}' but the engine does not "
                       f"({', '.join(engine_list)})", "rebuild the engine: `make`")
    return rep.add("family", "pass", f"{fam} ({family_registry.FAMILIES[fam].get('display', fam)})")


def engine_families():
    """The engine's own family list (`colibri families`), or None when this build has no such command."""
    exe = engine_client.RELEASE
    if not exe.exists():
        return None
    try:
        r = subprocess.run([str(exe), "families"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = r.stdout.split()
    return names if r.returncode == 0 and names else None


def fmt_bytes(n):
    return resource_plan.fmt_bytes(n)


def check_shards(rep, d, man, deep):
    """Presence, headers, truncation; with deep, every tensor. Returns {shard: (header, start, size)}."""
    missing, problems, opened = [], [], {}
    for s in man["shards"]:
        p = d / s
        if not p.is_file():
            missing.append(s)
            continue
        try:
            header, start, size = cs.read_raw_header(p)
        except (cs.ContainerError, OSError) as e:
            problems.append(str(e))
            continue
        tensors, bad = cs.check_entries(header, start, size, p)
        problems += [f"{s}: {b}" for b in (bad if deep else bad[:1])]
        opened[s] = (header, start, size, tensors)
    listed = set(man["shards"])
    extra = sorted(p.name for p in d.glob("*.safetensors") if p.name not in listed)
    if missing:
        rep.add("shards", "fail", f"missing: {', '.join(missing)} (listed in colibri.json)",
                "the conversion is incomplete or files were deleted: re-run `coli convert SRC OUT`")
    total = sum(v[2] for v in opened.values())
    rep.many("shard headers", problems, f"{len(opened)} shard(s), {fmt_bytes(total)}, headers consistent with "
             "the file sizes", "the file is truncated or damaged: re-run `coli convert SRC OUT` "
             "(it resumes and rewrites damaged shards only after you delete them)")
    if extra:
        rep.add("stray shards", "warn", f"not listed in colibri.json: {', '.join(extra)}",
                "they are ignored; delete them, or re-convert if they belong to this model")
    if deep:
        check_tensors(rep, man, opened)
        if not missing:
            check_checksums(rep, d, man)
    return opened


def check_checksums(rep, d, man):
    """--deep: every shard's bytes against the checksums the converter recorded."""
    status, lines = shard_sums.verify(d, man)
    fix = {"fail": shard_sums.FIX,
           "warn": "re-convert with this colibri (`coli convert SRC OUT`) to record checksums"}.get(status)
    rep.add("checksums", status, "\n".join(lines), fix)


def check_tensors(rep, man, opened):
    problems, warnings, seen = [], [], {}
    count = 0
    experts = {}  # (layer, expert) -> [(offset, end, shard, proj)]
    for s, (header, start, size, tensors) in opened.items():
        try:
            table = cs.storage_table(header, s)
        except cs.ContainerError as e:
            problems.append(str(e))
            table = {}
        if start % 64:
            warnings.append(f"{s}: the data section starts at byte {start}, not 64-byte aligned")
        end = start
        for name, t in tensors.items():
            count += 1
            if name in seen:
                problems.append(f"tensor '{name}' is in both {seen[name]} and {s}")
            seen[name] = s
            if table:
                msg = cs.check_storage(name, t, table.get(name))
                if msg:
                    problems.append(f"{s}: {msg}")
            if t["offset"] % cs.DTYPE_SIZE[t["dtype"]]:
                problems.append(f"{s}: tensor '{name}' at byte {t['offset']} is not aligned to its "
                                f"{cs.DTYPE_SIZE[t['dtype']]}-byte elements")
            end = max(end, t["offset"] + t["nbytes"])
            m = cs.EXPERT_RE.match(name)
            if m:
                experts.setdefault((int(m.group(1)), int(m.group(2))), []).append(
                    (t["offset"], t["offset"] + t["nbytes"], s, name.rsplit(".", 2)[-2]))
        for name in table:
            if name not in tensors:
                problems.append(f"{s}: colibri.tensors lists '{name}', which the shard does not hold")
        if size > end:
            warnings.append(f"{s}: {size - end} bytes after the last tensor")
    arch = man["arch"]
    E = int(arch.get("num_experts") or 0)
    for layer, kind in enumerate(arch.get("layer_mlp") or []):
        if kind != "moe":
            continue
        for e in range(E):
            parts = sorted(experts.get((layer, e), []))
            projs = sorted(p[3] for p in parts)
            if projs != ["down_proj", "gate_proj", "up_proj"]:
                problems.append(f"layer {layer} expert {e}: has {projs or 'no tensors'}, needs gate/up/down_proj")
                continue
            if len({p[2] for p in parts}) > 1 or any(a[1] != b[0] for a, b in zip(parts, parts[1:])):
                warnings.append(f"layer {layer} expert {e}: gate/up/down are not one contiguous byte range")
    rep.many("tensors", problems, f"walked {count} tensors: offsets, dtypes, shapes, storage entries and expert "
             "layout agree", "the container is damaged: re-run `coli convert SRC OUT` into a fresh directory")
    if warnings:
        rep.many("tensor layout", warnings, "", "re-convert with this colibri's `coli convert` to get the "
                 "documented layout", status="warn")


def check_tokenizer(rep, d):
    p = d / "tokenizer.json"
    if not p.is_file():
        rep.add("tokenizer", "fail", "no tokenizer.json: text prompts, chat and serve cannot work (token ids still do)",
                "copy tokenizer.json from the source checkpoint into the model directory")
    else:
        try:
            tok = json.loads(p.read_text(encoding="utf-8"))
            kind = tok["model"]["type"] if isinstance(tok, dict) and isinstance(tok.get("model"), dict) else None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            kind, err = None, e
        else:
            err = "it has no model section"
        if kind:
            rep.add("tokenizer", "pass", f"tokenizer.json ({kind})")
        else:
            rep.add("tokenizer", "fail", f"tokenizer.json is unreadable ({err})",
                    "copy tokenizer.json again from the source checkpoint")
    try:
        from colibri.chat_template import render as chat_template
        chat_template.load_chat_template(str(d))
        rep.add("chat template", "pass", "found")
    except ImportError:
        rep.add("chat template", "warn", "this colibri has no chat-template renderer", "use --raw prompts")
    except Exception as e:  # noqa: BLE001 - TemplateError or unreadable files
        rep.add("chat template", "warn", f"{e}".split("; use --raw")[0],
                "copy chat_template.jinja or tokenizer_config.json from the source checkpoint; "
                "until then `coli run --raw` works")


def check_memory(rep, d, man, mem):
    """The engine's split of the default budget (resource_plan.budget_split, the same as
    `coli plan`): refused when the dense trunk, KV and runtime do not fit; routed experts that
    do not fit stream from disk."""
    budget = mem["default_budget"]
    if budget is None:
        return rep.add("memory", "warn", "available memory is unknown (no /proc/meminfo)", "check `free -g` by hand")
    try:
        scan = container_scan.scan(d)
    except container_scan.ContainerError:
        return rep.add("memory", "warn", "not checked: the shards are damaged (see above)", None)
    ctx = launch_opts.default_ctx(man)
    kv = family_specs.kv_slot_bytes(family_specs.manifest_layers(man), ctx, family_registry.KV_DEFAULT)
    batch = default_batch(resource_plan.cpu_info()["engine_kernels"])  # the engine's, without --batch
    runtime = resource_plan.runtime_bytes(man, ctx, batch, launch_opts.usable_cpus(),
                                          tokenizer_bytes=scan["tokenizer_bytes"])
    ckpt = resource_plan.KV_MAX_CHECKPOINTS * resource_plan.checkpoint_bytes(scan, ctx)
    grammar = resource_plan.grammar_reserve(scan["arch"]["vocab"] or 0, 1) if scan["tokenizer_bytes"] else 0
    split = resource_plan.budget_split(scan, budget, kv, runtime, checkpoints=ckpt, grammar=grammar)
    # `coli serve` saves its KV slots by default, and its writer's bound is reserved too
    writer = resource_plan.kv_writer_reserve(kv, resource_plan.checkpoint_bytes(scan, ctx))
    served = resource_plan.budget_split(scan, budget, kv, runtime, checkpoints=ckpt, grammar=grammar, persist=writer)
    gb = fmt_bytes
    parts = f"dense {gb(split['dense'])} + {ctx}-token KV {gb(kv)} + runtime {gb(runtime)}" + \
        (f" + checkpoints {gb(ckpt)}" if ckpt else "") + (f" + grammar {gb(grammar)}" if grammar else "")
    if not split["fits"]:
        return rep.add("memory", "fail", f"{parts} need {gb(split['min_ram'])} but the default budget (90% of "
                       f"available memory) is {gb(budget)}: the engine will refuse to start",
                       "free memory, lower --ctx, or convert with a smaller dense quantization (`--dense q8`)")
    if not served["fits"]:
        return rep.add("memory", "warn", f"{parts} fit the default budget {gb(budget)}, but saving KV slots (`coli serve` "
                       f"does by default) reserves {gb(writer)} more, {gb(served['min_ram'])} in all with one slot: "
                       "`coli serve` will refuse to start", "serve with --no-kv-persist, lower --ctx, or free memory")
    serve_note = f"; saving KV slots (`coli serve` does by default) reserves {gb(writer)} more"
    E = scan["experts"]["per_layer"]
    if E and split["cap"] < E:
        return rep.add("memory", "pass", f"{parts} fit the default budget {gb(budget)}; {split['cap']} of {E} experts "
                       f"per layer stay in RAM and the rest stream from disk (decoding is bound by disk reads){serve_note}")
    return rep.add("memory", "pass", f"{parts}{' + every expert' if E else ''} fit the default budget {gb(budget)}"
                   f"{serve_note}")


def check_disk(rep, d, mem):
    info = resource_plan.disk_info(d)
    free = info["free"]
    if free is None:
        return rep.add("disk", "warn", f"cannot read free space at {d}", None)
    need = 1 << 30  # room for KV snapshots, usage counts and profiles next to the model
    if free < need:
        return rep.add("disk", "warn", f"{free / 1e9:.2f} GB free on {info['fs'] or 'the'} filesystem holding the model",
                       "free at least 1 GB there for KV snapshots and usage statistics")
    return rep.add("disk", "pass", f"{free / 1e9:.1f} GB free ({info['fs'] or 'unknown'} filesystem)")


def check_o_direct(rep, d, man):
    import mmap
    shard = next((d / s for s in man["shards"] if (d / s).is_file()), None)
    if shard is None or not hasattr(os, "O_DIRECT"):
        return rep.add("O_DIRECT", "warn", "cannot test: no shard to open" if shard is None else
                       "this platform has no O_DIRECT", "expert streaming will use buffered reads")
    buf = mmap.mmap(-1, 4096)
    try:
        fd = os.open(shard, os.O_RDONLY | os.O_DIRECT)
        try:
            os.preadv(fd, [buf], 0)
        finally:
            os.close(fd)
    except OSError as e:
        return rep.add("O_DIRECT", "warn", f"{shard.name}: O_DIRECT read failed ({e.strerror}); the filesystem "
                       "(tmpfs or some overlays) does not support it",
                       "keep models on a local disk filesystem (ext4, xfs, btrfs) for uncached expert reads")
    finally:
        buf.close()
    return rep.add("O_DIRECT", "pass", "aligned direct reads work on the model's filesystem")


def check_engine_load(rep, d):
    """--deep: the engine's own loader validates every tensor the architecture needs."""
    if not engine_client.ENGINE.exists():
        return rep.add("engine load", "fail", "skipped: the engine is not built", "run `make`")
    t0 = time.monotonic()
    try:
        with engine_client.Engine(d, ctx=16) as eng:
            info = eng.info
    except engine_client.EngineError as e:
        return rep.add("engine load", "fail", e.message, "re-run `coli convert SRC OUT`; if it persists, report it")
    return rep.add("engine load", "pass", f"READY in {time.monotonic() - t0:.2f} s ({info.get('family')}, "
                   f"kernels {info.get('kernels')}, tokenizer {'yes' if info.get('tokenizer') == '1' else 'no'})")


# ---------------------------------------------------------------- command

def diagnose(model, deep=False):
    rep = Report()
    mem = resource_plan.memory_info()
    check_engine(rep)
    man = None
    if not model:
        rep.add("model", "warn", "no model given: only the engine and the machine were checked",
                "pass --model DIR (or set COLI_MODEL) to check a model")
    else:
        man = check_model_dir(rep, model)
    if man is not None:
        d = Path(model)
        check_family(rep, man)
        opened = check_shards(rep, d, man, deep)
        check_tokenizer(rep, d)
        check_memory(rep, d, man, mem)
        check_disk(rep, d, mem)
        check_o_direct(rep, d, man)
        if deep and all(c["status"] != "fail" for c in rep.checks):
            check_engine_load(rep, d)
        check_open_files(rep, len(opened))
    else:
        check_open_files(rep, 0)
    check_overcommit(rep, mem)
    return rep


def add_arguments(p):
    model_arg(p)
    p.add_argument("--deep", action="store_true", help="walk every tensor and load the model in the engine")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")


def run(args):
    # a pulled name (--model smollm2) means its container in the model store; read-only, so
    # a name not pulled yet is reported, not fetched
    rep = diagnose(model_path(args.model) if args.model else None, deep=args.deep)
    code = RANK[rep.worst]
    if args.json:
        print(json.dumps({"model": args.model, "deep": args.deep, "checks": rep.checks, "worst": rep.worst,
                          "exit_code": code}, indent=1))
        return code
    color = sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
    paint = {"pass": "\033[32m", "warn": "\033[33m", "fail": "\033[31m"}
    for c in rep.checks:
        tag = f"[{c['status']}]"
        if color:
            tag = paint[c["status"]] + tag + "\033[0m"
        lines = c["detail"].split("\n") if c["detail"] else [""]
        print(f"{tag} {c['name']:<14} {lines[0]}")
        for ln in lines[1:]:
            print(f"       {'':<14} {ln}")
        if c["fix"] and c["status"] != "pass":
            print(f"       {'':<14} fix: {c['fix']}")
    n = {s: sum(1 for c in rep.checks if c["status"] == s) for s in RANK}
    print(f"\n{n['pass']} passed, {n['warn']} warning(s), {n['fail']} failed"
          + ("" if args.deep or not args.model else "  (--deep walks every tensor and loads the model)"))
    return code
