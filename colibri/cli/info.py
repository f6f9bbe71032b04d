"""`coli info`: a converted model (family, geometry, experts, storage per tensor class, sampling
defaults), the engine build and this machine; read-only, a pulled name is never fetched."""
import os

from colibri import sampling
from colibri.engine_status import engine_status
from colibri.errors import UserError
from colibri.machine.probe import discover, machine_lines
from colibri.model import container_scan
from colibri.model.paths import model_arg, require_model

HELP = "describe a converted model, the engine build and this machine"


def add_arguments(i):
    model_arg(i)


def run(args):
    d = require_model(args, fetch=False) if args.model else None  # read-only: never pulls
    if d is not None:
        model_info(d)
    else:
        print("model        none given (pass --model DIR or set COLI_MODEL)")
    st = engine_status()
    eng = (f"colibri {st['version']}, kernels {st['kernels']}" + (f"; {st['stale']} changed since: run make"
           if st["stale"] else "")) if st["version"] else ("not built (run make)" if not st["built"] else
                                                           f"does not run ({st['error']}); run make")
    print(f"engine       {eng}")
    for line in machine_lines(discover(d or os.getcwd())):
        print(line)


def storage_by_class(d, man):
    """{tensor class: {storage: tensor count}} from the shards' colibri.tensors tables: what the
    container holds, which can differ from the requested quant (a 4-bit GGUF stays 4-bit)."""
    out = {}
    for s in man["shards"]:
        header, _, _ = container_scan.read_raw_header(d / s)
        for name, entry in container_scan.storage_table(header, d / s).items():
            by = out.setdefault(container_scan.tensor_class(name), {})
            by[entry[0]] = by.get(entry[0], 0) + 1
    return out


def quant_line(by_class):
    order = ["expert", "shared_expert", "attention", "dense_mlp", "embed", "lm_head", "router", "norm"]
    parts = []
    for cls in sorted(by_class, key=lambda c: (order.index(c) if c in order else len(order), c)):
        kinds = by_class[cls]
        if len(kinds) == 1:
            parts.append(f"{cls.replace('_', ' ')} {next(iter(kinds))}")
        else:  # mixed storage in one class: say how many tensors each
            parts.append(f"{cls.replace('_', ' ')} " + "/".join(f"{k} x{n}" for k, n in sorted(kinds.items())))
    return ", ".join(parts)


def attn_label(attn):
    """An attention spec's kind for `coli info`; DeepSeek-V4's layers by what they keep."""
    c = attn.get("compress")
    if attn.get("kind") == "dsv4":
        return f"{'CSA' if c.get('indexer') else 'HCA'} (rate {c['rate']})" if c else "sliding"
    return attn.get("kind")


def model_info(d):
    try:  # require_model has checked the manifest and the headers; the fields are checked here
        m = container_scan.read_manifest(d)
        a = m["arch"]
        size = sum(f.stat().st_size for f in d.glob("*.safetensors"))
        lines = [f"model        {d}",
                 f"family       {m['family']}  (converter {m['converter_version']}, format {m['format_version']})",
                 f"layers       {a['num_layers']}  hidden {a['hidden_size']}  heads {a['num_heads']}/"
                 f"{a['num_kv_heads']}  head_dim {a['head_dim']}  vocab {a['vocab_size']}"]
        if a.get("num_experts"):
            moe_layers = sum(1 for k in a["layer_mlp"] if k == "moe")
            lines.append(f"experts      {a['num_experts']} per layer, top-{a['num_experts_per_tok']}, "
                         f"{moe_layers} MoE layers")
        kinds = [attn_label(spec.get("attn") or {}) for spec in m.get("layers") or []]
        if len(set(kinds) - {None}) > 1:  # a hybrid: say which layers keep a fixed state
            fixed = sum(int(((spec.get("attn") or {}).get("state") or {}).get("fixed_bytes", 0)) for spec in m["layers"])
            mix = " + ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds) if k)
            lines.append(f"attention    {mix} layers; fixed state {fixed / 1e6:.2f} MB per slot (prefix reuse "
                         "resumes at turn-boundary checkpoints)")
        if m.get("mtp_layers"):
            lines.append(f"mtp          {len(m['mtp_layers'])} multi-token-prediction layer(s) (layer "
                         f"{', '.join(map(str, m['mtp_layers']))}): "
                         + ("drafts tokens with --draft mtp" if m.get("mtp") else "kept in the container, not run "
                            "(re-convert for --draft mtp)"))
        lines.append(f"quant        {quant_line(storage_by_class(d, m))}")
        lines.append(f"on disk      {size / 1e6:.1f} MB in {len(m['shards'])} shard(s)")
        lines.append(f"sampling     {sampling.describe(*sampling.model_defaults(d))}; coli chat and coli serve "
                     "use these where a flag or request sets none, coli run decodes greedily")
    except container_scan.ContainerError as e:
        raise UserError(str(e)) from None
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise UserError(f"{d / 'colibri.json'} is damaged ({type(e).__name__}: {e}); re-run coli convert, "
                        f"`coli doctor --model {d}` checks the model") from None
    print("\n".join(lines))
