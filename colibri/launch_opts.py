"""The launcher-wide engine and sampling flags, declared once for `coli run`, `coli chat` and the
server, and checked before the engine starts.

A value the engine cannot honour is refused with the reason, never clamped. A tuned profile
(colibri/machine/tune_profile.py) fills only the knobs the user did not give; an explicit flag always wins.
"""
import json
import os
import sys
from pathlib import Path

from colibri.errors import UserError
from colibri.machine import probe as machine_probe
from colibri.machine.probe import fmt_bytes
from colibri.limits import DEFAULT_BATCH, DEFAULT_BATCH_AMX, DEFAULT_SPIN, MAX_KV_SLOTS, MAX_SPIN, RUNTIME_BASE, default_batch
from colibri.family import specs as family_specs
from colibri.machine import tune_profile
from colibri.model import container_scan
import family_registry

GB = 1e9
KV_TYPES = ("f16", "bf16", "f32")  # family_registry.KV_TYPES, c/kernels/kv_kernels.c
KERNEL_SETS = ("portable", "avx2", "avx512", "vnni", "amx", "neon")  # c/kernels/dispatch.c kernels_isa_name


# --spin's meaning; each command adds its own default (run and chat: the tuned profile's)
SPIN_HELP = ("how long an idle engine thread spins before it sleeps, in OpenMP spin iterations "
             f"(GOMP_SPINCOUNT), 0 to {MAX_SPIN}")

# The engine flags, declared once. Each command that starts (or plans) an engine names the ones
# it honours and may say its own default in the help; the meaning and type stay the same.
ENGINE_FLAGS = {
    "ctx": dict(type=int, help="context length in tokens (default: min(model max, 4096))"),
    "threads": dict(type=int, help="compute threads (default: tuned profile, else all CPUs)"),
    "batch": dict(type=int, help=f"positions per forward pass during prefill (default: tuned profile, else {DEFAULT_BATCH}, "
                  f"{DEFAULT_BATCH_AMX} with AMX kernels; 1 = token by token)"),
    "spin": dict(type=int, metavar="N",
                 help=f"{SPIN_HELP}: longer answers a parallel region sooner but takes the cores from everything "
                      f"else (default: tuned profile, else {DEFAULT_SPIN})"),
    "kv-slots": dict(type=int, dest="kv_slots", help=f"independent KV caches, 1-{MAX_KV_SLOTS} (default 1)"),
    "kv": dict(choices=KV_TYPES, default=None,
               help="KV cache element type (default f16, half the memory of f32; f32 keeps K/V exactly)"),
    "ram": dict(type=float, metavar="GB",
                help="RAM budget in GB, fractions allowed (default: $COLI_RAM_GB, else 90%% of the memory available "
                     "now, cgroup limits included). The dense weights, KV cache and working memory stay resident; "
                     "routed experts stream from disk through a cache sized from what is left"),
    "cap": dict(type=int, metavar="N", help="expert cache slots per MoE layer, 1 to the layer's expert count "
                "(default: as many as the RAM budget holds)"),
    "no-direct": dict(action="store_true", dest="no_direct", default=None,
                      help="read experts with buffered reads instead of O_DIRECT"),
    "readahead": dict(choices=("on", "off"), help="prefetch the next layer's likely experts while this one computes"),
    "prefill-pass": dict(type=int, dest="prefill_pass", metavar="N",
                         help="positions per prefill pass while experts stream, a multiple of --batch: each routed "
                              "expert is read once per pass (default: the whole prompt, as the RAM budget allows)"),
    "pin": dict(choices=("auto", "off"), help="pin the experts this model used most (.coli_usage) at start-up "
                "(default auto)"),
    "kernels": dict(choices=KERNEL_SETS, help="the engine's kernel set (default: the best this CPU runs; "
                    "`coli info` names it); the engine refuses one this CPU or build cannot run"),
    "draft": dict(choices=("lookup", "mtp", "off"),
                  help="speculative decoding: lookup drafts the tokens that followed the latest earlier match of the "
                       "last few tokens (prompt and output), verified in one pass; mtp drafts with the checkpoint's "
                       "multi-token-prediction layer (containers whose `coli info` says it drafts). The output is exactly the same either way (default off)"),
    "draft-max": dict(type=int, dest="draft_max", metavar="K", help="most tokens drafted at a time, 1-64 (default 8)"),
    "draft-adapt": dict(choices=("on", "off"), dest="draft_adapt",
                        help="on (default): the draft length follows the measured acceptance, and drafting pauses "
                             "where it costs more time than it saves; off: always draft --draft-max tokens"),
    "no-profile": dict(action="store_true", dest="no_profile",
                       help="ignore the profile saved by `coli tune` (also COLI_NO_PROFILE=1)"),
}
STREAM_FLAGS = ("ram", "cap", "no-direct", "readahead", "pin", "prefill-pass")  # the expert store's knobs
DRAFT_FLAGS = ("draft", "draft-max", "draft-adapt")  # speculative decoding
LAUNCH_FLAGS = ("ctx", "threads", "batch", "spin", "kv-slots", "kv") + STREAM_FLAGS + DRAFT_FLAGS + ("kernels", "no-profile")


def add_engine_flags(p, names=LAUNCH_FLAGS, group="engine", **overrides):
    """Adds the named ENGINE_FLAGS to parser p (in an argument group unless group is None).
    overrides: flag name with '_' for '-' -> a dict that replaces parts of its declaration
    (a command's own default or help text)."""
    g = p.add_argument_group(group) if group else p
    for name in names:
        spec = {**ENGINE_FLAGS[name], **overrides.get(name.replace("-", "_"), {})}
        g.add_argument(f"--{name}", **spec)


def engine_args(args):
    """The engine command-line arguments for the engine flags set in args, the RAM budget
    included (ram_budget_gb: the flag, $COLI_RAM_GB or the default)."""
    out = []
    for name in ("ctx", "threads", "batch", "kv"):
        v = getattr(args, name, None)
        if v is not None:
            out += [f"--{name}", str(v)]
    return out + stream_args(args)


def stream_args(args):
    """The engine arguments passed through as given: the expert store's (STREAM_FLAGS), the
    drafter's (DRAFT_FLAGS) and the kernel set."""
    ram = ram_budget_gb(args)
    out = ["--ram", f"{ram:.6g}"] if ram is not None else []
    if getattr(args, "cap", None) is not None:
        out += ["--cap", str(args.cap)]
    if getattr(args, "no_direct", None):
        out.append("--no-direct")
    if getattr(args, "prefill_pass", None) is not None:
        if args.prefill_pass < 0:
            raise UserError(f"--prefill-pass {args.prefill_pass}: needs 0 (automatic) or a multiple of --batch")
        out += ["--prefill-pass", str(args.prefill_pass)]
    for name in ("readahead", "pin", "kernels", "draft", "draft-adapt"):
        if getattr(args, name.replace("-", "_"), None) is not None:
            out += [f"--{name}", getattr(args, name.replace("-", "_"))]
    if getattr(args, "draft_max", None) is not None:
        if not 1 <= args.draft_max <= 64:
            raise UserError(f"--draft-max {args.draft_max}: needs 1 to 64 tokens")
        out += ["--draft-max", str(args.draft_max)]
    return out


def budget_line(info, batch=None):
    """The engine's RAM split from its READY fields, one line; None from an engine without them.
    batch: the --batch given (the engine lowers only a default batch to fit a tight --ram)."""
    try:
        b = {k: int(info[k]) for k in ("ram_budget", "dense_bytes", "kv_bytes", "runtime_bytes", "expert_cache_bytes",
                                      "cap", "experts")}
    except (KeyError, ValueError):
        return None
    mb = lambda k: fmt_bytes(b[k])  # noqa: E731
    if batch is None and info.get("batch", "").isdigit() and int(info["batch"]) < default_batch(info.get("kernels")):
        extra_note = f"; prefill batch lowered to {info['batch']} to fit"
    else:
        extra_note = ""
    line = (f"RAM budget {b['ram_budget'] / 1e9:.2f} GB: dense {mb('dense_bytes')} + KV {mb('kv_bytes')} + "
            f"runtime {mb('runtime_bytes')} + "
            + "".join(f"{name} {fmt_bytes(int(info[k]))} + " for name, k in
                      (("checkpoints", "checkpoint_bytes"), ("grammar", "grammar_bytes"), ("KV writer", "kv_writer_bytes"),
                       ("mask cache", "mask_cache_bytes"))
                      if info.get(k, "0").isdigit() and int(info.get(k, "0")))
            + f"expert cache {mb('expert_cache_bytes')}")
    if b["experts"]:
        line += (f" ({b['cap']} of {b['experts']} experts per layer"
                 + (", the MTP layer's included" if info.get("draft") == "mtp" and b["cap"] < b["experts"] else "")
                 + (", every expert in RAM" if b["cap"] >= b["experts"] else ", the rest stream from disk")
                 + (f", {info.get('pinned')} pinned" if info.get("pinned", "0") != "0" else "") + ")")
    if info.get("draft_off"):
        extra_note += f"; drafting off: the model's {info['draft_off'].replace('_', ' ')} cannot be cut back"
    return line + extra_note


def ram_budget_gb(args):
    """The RAM budget in GB: --ram, else $COLI_RAM_GB, else 90% of the memory usable now
    (the planner's default budget, colibri/machine/probe.py); None when none of them is known."""
    ram = getattr(args, "ram", None)
    source = "--ram"
    if ram is None and os.environ.get("COLI_RAM_GB", "").strip():
        raw, source = os.environ["COLI_RAM_GB"].strip(), "COLI_RAM_GB"
        try:
            ram = float(raw)
        except ValueError:
            raise UserError(f"COLI_RAM_GB={raw}: needs a number of GB, e.g. 8 or 0.5") from None
    if ram is not None:
        if not ram > 0 or ram != ram or ram == float("inf"):
            raise UserError(f"{source} {ram:g}: needs a positive number of GB")
        return ram
    budget = machine_probe.memory_info()["default_budget"]
    return budget / GB if budget else None


def add_sampling_flags(p, think=True, max_tokens_help="stop after N tokens (default: end of context)",
                       model_defaults=False):
    """model_defaults: unset flags take the model's sampling defaults (colibri/sampling.py, shown by
    `coli info`) instead of greedy decoding."""
    g = p.add_argument_group("sampling")
    d = ("the model's, see coli info", ) * 4 if model_defaults else ("0: greedy", "1: off", "0: off", "0: off")
    g.add_argument("--temp", type=float, help=f"temperature, 0-100, 0 is greedy (default {d[0]})")
    g.add_argument("--top-p", type=float, dest="top_p", help=f"nucleus sampling, 0-1 (default {d[1]})")
    g.add_argument("--top-k", type=int, dest="top_k", help=f"keep the K most likely tokens (default {d[2]})")
    g.add_argument("--min-p", type=float, dest="min_p",
                   help=f"drop tokens below P x the top probability, 0-1 (default {d[3]})")
    g.add_argument("--repeat-penalty", type=float, dest="repeat_penalty",
                   help="divide the logits of tokens in the last --repeat-last-n by this, above 0 (default "
                        + ("the model's" if model_defaults else "1: off") + ")")
    g.add_argument("--presence-penalty", type=float, dest="presence_penalty",
                   help="subtract this from tokens in the window, -2 to 2 (default 0)")
    g.add_argument("--frequency-penalty", type=float, dest="frequency_penalty",
                   help="subtract this per occurrence in the window, -2 to 2 (default 0)")
    g.add_argument("--repeat-last-n", type=int, dest="repeat_last_n",
                   help="tokens (prompt and output) the penalties look back over; -1: the context (default 64)")
    g.add_argument("--seed", type=int, help="sampling seed; the same seed and prompt give the same tokens")
    g.add_argument("--max-tokens", type=int, dest="max_tokens", help=max_tokens_help)
    if think:
        g.add_argument("--think", dest="think", action="store_true", default=None,
                       help="let a thinking model reason before answering (its chat template's enable_thinking)")
        g.add_argument("--no-think", dest="think", action="store_false", help="ask a thinking model to answer directly")


def manifest(model_dir):
    try:
        return container_scan.read_manifest(model_dir)
    except container_scan.ContainerError as e:
        raise UserError(str(e)) from None


def check_sampling(args, ctx, max_ctx=None):
    """Range checks from docs/protocol.md; max_tokens must leave room for the prompt in the context."""
    def bad(flag, v, why):
        raise UserError(f"{flag} {v}: {why}")
    temp, top_p, top_k, min_p = (getattr(args, k, None) for k in ("temp", "top_p", "top_k", "min_p"))
    if temp is not None and not 0 <= temp <= 100:
        bad("--temp", temp, "the engine takes 0 (greedy) to 100")
    if top_p is not None and not 0 < top_p <= 1:
        bad("--top-p", top_p, "needs a value above 0 and at most 1")
    if top_k is not None and top_k < 0:
        bad("--top-k", top_k, "needs 0 (off) or a positive count")
    if min_p is not None and not 0 <= min_p <= 1:
        bad("--min-p", min_p, "needs a value from 0 to 1")
    rp = getattr(args, "repeat_penalty", None)
    if rp is not None and not 0 < rp <= 100:
        bad("--repeat-penalty", rp, "needs a value above 0 and at most 100 (1: off)")
    for flag in ("presence_penalty", "frequency_penalty"):
        v = getattr(args, flag, None)
        if v is not None and not -2 <= v <= 2:
            bad("--" + flag.replace("_", "-"), v, "needs a value from -2 to 2 (0: off)")
    rln = getattr(args, "repeat_last_n", None)
    if rln is not None and rln < -1:
        bad("--repeat-last-n", rln, "needs -1 (the context), 0 (off) or a count of tokens")
    seed = getattr(args, "seed", None)
    if seed is not None and not 0 <= seed < 1 << 64:
        bad("--seed", seed, "needs an unsigned 64-bit integer")
    mt = getattr(args, "max_tokens", None)
    if mt is not None and mt != -1:
        if mt < 1:
            bad("--max-tokens", mt, "needs at least 1 (or -1: until the context is full)")
        if mt >= ctx:
            more = f" or raise --ctx (the model holds {max_ctx})" if max_ctx and max_ctx > ctx else ""
            bad("--max-tokens", mt, f"the context holds {ctx} tokens including at least one prompt token; "
                f"give at most {ctx - 1}{more}")


def resolve(args, model_dir, log=None):
    """Checks the engine flags against the model and this machine, applies the tuned profile to
    knobs left unset, and returns the Engine keyword arguments. Prints notes through log."""
    log = log or (lambda msg: print(f"coli: {msg}", file=sys.stderr))
    man = manifest(model_dir)
    arch = man["arch"]
    max_ctx = int(arch.get("max_position_embeddings") or 1)
    ctx, threads, batch = getattr(args, "ctx", None), getattr(args, "threads", None), getattr(args, "batch", None)
    slots = getattr(args, "kv_slots", None)
    check_ctx(ctx, arch)
    if slots is not None and not 1 <= slots <= MAX_KV_SLOTS:
        raise UserError(f"--kv-slots {slots}: the engine has 1 to {MAX_KV_SLOTS} KV slots")
    if threads is not None and not 1 <= threads <= 1024:
        raise UserError(f"--threads {threads}: the engine takes 1 to 1024")
    if batch is not None and not 1 <= batch <= 65536:
        raise UserError(f"--batch {batch}: the engine takes 1 to 65536")
    spin = getattr(args, "spin", None)
    check_spin(spin)
    check_cap(getattr(args, "cap", None), arch)
    eff_ctx = ctx or default_ctx(man)
    check_sampling(args, eff_ctx, max_ctx)

    applied = tuned_knobs(args, model_dir, log)
    threads = applied.get("threads", threads)
    batch = applied.get("batch", batch)
    spin = applied.get("spin", spin)
    check_memory(args, model_dir, man, eff_ctx, slots or 1, log)
    cpus = usable_cpus()
    if threads is not None and threads > cpus:
        log(f"--threads {threads} is more than the {cpus} CPUs this process may use; decoding will be slower")
    return {"ctx": ctx, "threads": threads, "batch": batch, "spin": spin, "kv_slots": slots,
            "kv": getattr(args, "kv", None), "extra": stream_args(args)}


def tuned_knobs(args, model_dir, log):
    """The tuned profile's knobs for those the user left unset ({} without a profile, or under
    --no-profile / COLI_NO_PROFILE=1); says through log what it applies and which flags it kept."""
    if getattr(args, "no_profile", False) or os.environ.get("COLI_NO_PROFILE") == "1":
        return {}
    prof = tune_profile.load(model_dir)
    if not prof or not prof["knobs"]:
        return {}
    applied, kept = {}, []
    for k, v in prof["knobs"].items():
        if getattr(args, k, None) is None:
            applied[k] = v
        else:
            kept.append(f"--{k} {getattr(args, k)}")
    if applied:
        log("using the tuned profile " + " ".join(f"{k}={v}" for k, v in applied.items())
            + (f" (explicit {', '.join(kept)} kept)" if kept else "")
            + f" from {prof['path']}; --no-profile ignores it")
    return applied


def check_spin(spin):
    """--spin: GOMP_SPINCOUNT's range as this project passes it (limits.MAX_SPIN)."""
    if spin is not None and not 0 <= spin <= MAX_SPIN:
        raise UserError(f"--spin {spin}: needs 0 (sleep at once) to {MAX_SPIN} spin iterations")


def usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_ctx(man):
    fam = family_registry.FAMILIES.get(man.get("family"), {})
    max_ctx = int(man["arch"].get("max_position_embeddings") or 1)
    return min(max_ctx, fam.get("default_ctx", 4096))


CTX_MIN = 1  # the engine's own lower bound (c/engine/engine.c); the upper one is the model's


def check_ctx(ctx, arch):
    """The one --ctx range: every command that takes --ctx (run, chat, serve, web, logits, plan) checks
    it here, so a value one command accepts, another does not refuse."""
    max_ctx = int(arch.get("max_position_embeddings") or 1)
    if ctx is not None and not CTX_MIN <= ctx <= max_ctx:
        raise UserError(f"--ctx {ctx}: this model holds {CTX_MIN} to {max_ctx} positions (max_position_embeddings)")


def larger_ctx_hint(model_dir, args):
    """'; or raise --ctx (...)' when the model holds more positions than this run's context."""
    man = manifest(model_dir)
    max_ctx = int(man["arch"].get("max_position_embeddings") or 1)
    ctx = getattr(args, "ctx", None) or default_ctx(man)
    return f"; or raise --ctx (this model holds up to {max_ctx} positions)" if max_ctx > ctx else ""


def check_cap(cap, arch):
    if cap is None:
        return
    E = int(arch.get("num_experts") or 0)
    if not E:
        raise UserError(f"--cap {cap}: this model has no routed experts to cache")
    if not 1 <= cap <= E:
        raise UserError(f"--cap {cap}: each MoE layer has {E} experts; give 1 to {E} cache slots per layer")


def check_memory(args, model_dir, man, ctx, slots, log):
    """Refuses a RAM budget larger than the machine and explicit KV sizes that cannot fit; warns
    when a budget exceeds the memory available now. Whether the dense weights, KV cache and
    working memory fit the budget is the engine's to decide (it prints the split and refuses
    with the numbers); `coli plan` shows the same split beforehand."""
    mem = machine_probe.memory_info()
    usable, total = mem["usable"], mem["total"]
    kv = family_specs.kv_slot_bytes(family_specs.manifest_layers(man), ctx,
                                       getattr(args, "kv", None) or family_registry.KV_DEFAULT) * slots
    explicit_ram = getattr(args, "ram", None) is not None or bool(os.environ.get("COLI_RAM_GB", "").strip())
    ram = ram_budget_gb(args)
    if explicit_ram:
        budget = ram * GB
        where = "--ram" if getattr(args, "ram", None) is not None else "COLI_RAM_GB"
        if total and budget > total:
            raise UserError(f"{where} {ram:g}: this machine (or its cgroup) has {total / GB:.1f} GB in all")
        if usable and budget > usable:
            log(f"{where} {ram:g} GB is more than the {usable / GB:.1f} GB available now")
    explicit = getattr(args, "ctx", None) is not None or getattr(args, "kv_slots", None) is not None
    if usable and kv + RUNTIME_BASE > usable:
        msg = (f"a {ctx}-token KV cache x {slots} slot(s) needs {kv / GB:.2f} GB but only {usable / GB:.2f} GB "
               "of memory is available")
        if explicit:
            raise UserError(msg + "; lower --ctx or --kv-slots")
        log(msg + "; long conversations may be killed for memory (lower --ctx)")


def sampling_opts(args, default_max_tokens=None, defaults=None):
    """SUBMIT options from the sampling flags; an unset one comes from `defaults` (the model's,
    colibri/sampling.py), else is left to the engine (greedy)."""
    defaults = defaults or {}
    opts = {k: getattr(args, k, None) for k in ("temp", "top_p", "top_k", "min_p", "seed", "repeat_penalty",
                                                "presence_penalty", "frequency_penalty", "repeat_last_n")}
    opts = {k: defaults.get(k) if v is None else v for k, v in opts.items()}
    mt = getattr(args, "max_tokens", None)
    opts["max_tokens"] = mt if mt is not None else default_max_tokens
    return {k: v for k, v in opts.items() if v is not None}


def thinking_switch(model_dir):
    """The template variable that switches thinking: the registry's for the family, else
    enable_thinking (the common name) for families the registry does not mark."""
    try:
        fam = json.loads((Path(model_dir) / "colibri.json").read_text()).get("family")
    except (OSError, ValueError):
        fam = None
    return family_registry.FAMILIES.get(fam, {}).get("thinking") or "enable_thinking"


def template_supports_thinking(model_dir):
    """True when the model's chat template reads its thinking switch; None without a template."""
    try:
        from colibri.chat_template import render as chat_template
        source = chat_template.load_chat_template(str(model_dir))
    except Exception:  # noqa: BLE001 - no template, or none readable
        return None
    return thinking_switch(model_dir) in source


def thinking_vars(args, model_dir):
    """Template variables for --think/--no-think; refuses them for a model without a thinking switch."""
    think = getattr(args, "think", None)
    if think is None:
        return {}
    flag = "--think" if think else "--no-think"
    if getattr(args, "raw", False):
        raise UserError(f"{flag} switches the chat template's thinking mode; it has no effect with --raw")
    ok = template_supports_thinking(model_dir)
    if ok is None:
        raise UserError(f"{flag}: {model_dir} has no chat template to switch thinking in")
    if not ok:
        raise UserError(f"{flag}: this model's chat template has no thinking switch ({thinking_switch(model_dir)})")
    return {thinking_switch(model_dir): bool(think)}
