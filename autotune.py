"""`coli tune`: measure the scheduling-only engine knobs on this machine and save the winners.

Each candidate runs against the current best in paired, alternating runs (both engines stay
loaded; each pair sends the same prompt to both, in swapped order every other pair, so drift
cancels). A change is kept only when it wins clearly (median speed-up above the threshold and
faster in every pair, or all but one from 5 pairs) and its greedy tokens are identical in every
pair. Threads first, then the prefill batch, then how long idle threads spin before they sleep
(GOMP_SPINCOUNT: a longer spin answers each parallel region sooner, a shorter one leaves the cores
to other work). A spin longer than the default must also hold up with one busy process beside
the engine: on 2 cores, 2 threads that spin long wait for a partner the hog has displaced (SmolLM2
decode fell from 116 tok/s at spin 1000 to 0.9 at 200000 beside one busy loop).
The profile (colibri/machine/tune_profile.py) is keyed by machine and model; `coli run` and `coli chat`
apply it and say so, and an explicit flag always wins.
"""
import random
import statistics
import subprocess
import sys
import time

from colibri.errors import UserError
from colibri.model.paths import model_arg, require_model
from colibri.limits import DEFAULT_SPIN, default_batch
from colibri import engine_client
from colibri.machine import tune_profile
from colibri.model import container_scan
import resource_plan

HELP = "measure threads / prefill batch / thread spin on this machine and save the fastest as a profile"
SPIN_CANDIDATES = (0, 1000, 20000, 200000)  # sleep at once .. near libgomp's own default (300000)
LOADED_FLOOR = 0.8  # a longer spin may lose at most this much beside one busy process
DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p):
    model_arg(p)
    p.add_argument("--runs", type=int, default=3, help="paired runs per comparison (default 3)")
    p.add_argument("--tokens", type=int, default=32, help="tokens generated per run (default 32)")
    p.add_argument("--prompt-tokens", type=int, default=96, dest="prompt_tokens",
                   help="prompt length per run, so prefill batching counts too (default 96)")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="minimum median speed-up to keep a change (default 0.05 = 5%%)")
    p.add_argument("--show", action="store_true", help="print the saved profile and stop")
    p.add_argument("--reset", action="store_true", help="delete the saved profile and stop")


def say(msg):
    print(msg, flush=True)


def candidates(knob, cpus):
    if knob == "threads":
        return sorted({max(1, cpus // 2), cpus, max(1, cpus // 4) if cpus >= 8 else cpus} - {0})
    if knob == "spin":
        return list(SPIN_CANDIDATES)
    return [32, 64, 128, 256, 512]


class Bench:
    """Two engines, one per configuration, driven with the same prompts."""

    def __init__(self, model_dir, args, vocab):
        self.dir, self.args, self.vocab = model_dir, args, vocab
        self.ctx = args.prompt_tokens + args.tokens + 1
        self.engines = {}
        rng = random.Random(1234)
        self.body = [rng.randrange(vocab) for _ in range(args.prompt_tokens - 1)]

    def engine(self, cfg):
        key = tuple(sorted(cfg.items()))
        if key not in self.engines:
            try:
                self.engines[key] = engine_client.Engine(self.dir, ctx=self.ctx, threads=cfg["threads"],
                                                         batch=cfg["batch"], spin=cfg["spin"])
            except engine_client.EngineError as e:
                raise UserError(f"the engine could not start with {fmt(cfg)}: {e.message}") from None
            self.once(cfg, 0)  # warm-up: page in the weights, start the thread pool
        return self.engines[key]

    def once(self, cfg, pair):
        """One request; the first id changes per pair so no KV prefix is reused. Returns (seconds, tokens, end)."""
        eng = self.engines[tuple(sorted(cfg.items()))]
        prompt = [(pair * 7919) % self.vocab] + self.body
        toks, end = [], {}
        t0 = time.perf_counter()
        for ev in eng.generate(prompt, max_tokens=self.args.tokens, temp=0):
            if ev[0] == "data" and ev[1] >= 0:
                toks.append(ev[1])
            elif ev[0] == "end":
                end = ev[1]
        return time.perf_counter() - t0, toks, end

    def compare(self, base, cand, runs=None):
        """Paired runs; returns (ratios base/cand, identical tokens?, per-run stats of cand)."""
        self.engine(base), self.engine(cand)
        ratios, same, stats = [], True, []
        for i in range(runs or self.args.runs):
            pair = i + 1
            order = (base, cand) if i % 2 == 0 else (cand, base)
            res = {id(c): self.once(c, pair) for c in order}
            tb, kb, _ = res[id(base)]
            tc, kc, ec = res[id(cand)]
            ratios.append(tb / tc)
            same = same and kb == kc
            stats.append(ec)
        return ratios, same, stats

    def drop(self, keep):
        keys = {tuple(sorted(c.items())) for c in keep}
        for key in list(self.engines):
            if key not in keys:
                self.engines.pop(key).close()

    def close(self):
        for eng in self.engines.values():
            eng.close()
        self.engines = {}


def loaded_ratio(bench, base, cand):
    """Median base/cand time ratio of two paired runs beside a busy process (another job on the box)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        ratios, _, _ = bench.compare(base, cand, runs=2)
    finally:
        hog.kill()
        hog.wait()
    return statistics.median(ratios)


def judge(knob, value, current, ratios, same, threshold, loaded):
    """Whether to take a candidate, and the verdict to print. loaded() measures the candidate
    beside a busy process; it is asked only for a spin longer than the default that won."""
    if not same:
        return False, f"keep {current}: the greedy tokens differ, which must never happen (please report it)"
    if not clear_win(ratios, threshold):
        return False, f"keep {current}"
    if knob == "spin" and value > DEFAULT_SPIN:
        ratio = loaded()
        if ratio < LOADED_FLOOR:
            return False, f"keep {current}: beside one busy process it runs at {ratio:.2f}x, its threads wait for each other"
    return True, f"take {value}"


def fmt(cfg):
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def clear_win(ratios, threshold):
    wins = sum(r > 1 for r in ratios)
    needed = len(ratios) - (1 if len(ratios) >= 5 else 0)
    return statistics.median(ratios) >= 1 + threshold and wins >= needed


def run(args):
    d = require_model(args)
    if args.show or args.reset:
        return show_or_reset(args, d, tune_profile)
    if args.runs < 1 or args.tokens < 2 or args.prompt_tokens < 2:
        raise UserError("--runs needs at least 1, --tokens and --prompt-tokens at least 2")
    if args.threshold < 0:
        raise UserError(f"--threshold {args.threshold}: needs 0 or more")
    try:
        man = container_scan.read_manifest(d)
    except container_scan.ContainerError as e:
        raise UserError(str(e)) from None
    arch = man["arch"]
    if args.prompt_tokens + args.tokens + 1 > int(arch.get("max_position_embeddings") or 0):
        raise UserError(f"--prompt-tokens + --tokens must fit the model's {arch.get('max_position_embeddings')} positions")
    cpu = resource_plan.cpu_info()
    cpus = cpu["usable"]
    best = {"threads": cpus, "batch": default_batch(cpu["engine_kernels"]), "spin": DEFAULT_SPIN}  # no flags
    defaults = dict(best)
    say(f"tuning {d} ({man.get('family')}) on {cpu['model']}, {cpus} usable CPUs: {args.runs} paired run(s) of "
        f"{args.prompt_tokens} prompt + {args.tokens} generated tokens per comparison")
    bench = Bench(d, args, int(arch["vocab_size"]))
    measured = {}
    t_start = time.monotonic()
    try:
        for knob in ("threads", "batch", "spin"):
            tried = {best[knob]}
            for value in candidates(knob, cpus):
                current = best[knob]
                if value in tried:
                    continue
                tried.add(value)
                cand = {**best, knob: value}
                ratios, same, stats = bench.compare(best, cand)
                wins = sum(r > 1 for r in ratios)
                take, verdict = judge(knob, value, current, ratios, same, args.threshold,
                                      lambda: loaded_ratio(bench, best, cand))
                if take:
                    best, measured = cand, summarize(stats)
                say(f"  {knob} {value} vs {current}: {statistics.median(ratios):.2f}x "
                    f"({wins} of {len(ratios)} pairs faster) -> {verdict}")
                bench.drop([best])
        if not measured:
            bench.engine(best)
            measured = summarize([bench.once(best, args.runs + 1)[2]])
    finally:
        bench.close()
    knobs = {k: v for k, v in best.items() if v != defaults[k]}
    path = tune_profile.save(d, knobs, measured, extra={"defaults": defaults, "runs": args.runs,
                                                          "tokens": args.tokens, "prompt_tokens": args.prompt_tokens})
    say(f"saved {path} in {time.monotonic() - t_start:.0f} s: "
        + (fmt(knobs) if knobs else "the defaults were best (nothing to apply)")
        + (f"; {measured['decode_tok_s']:.1f} tok/s decode, {measured['prefill_tok_s']:.1f} tok/s prefill"
           if measured else ""))
    say("not tunable yet: expert cache slots, read-ahead and O_DIRECT (the engine maps every weight today)")
    if knobs:
        say("`coli run` and `coli chat` apply it from now on and say so; an explicit flag wins; --no-profile ignores it")
    return 0


def summarize(stats):
    dec = [float(s.get("decode_tok_s", 0)) for s in stats if s]
    pre = [float(s.get("prefill_tok_s", 0)) for s in stats if s]
    return {"decode_tok_s": statistics.median(dec) if dec else 0.0,
            "prefill_tok_s": statistics.median(pre) if pre else 0.0}


def show_or_reset(args, d, tune_profile):
    if args.reset:
        p = tune_profile.remove(d)
        print(f"deleted {p}" if p else "no saved profile for this machine and model")
        return 0
    prof = tune_profile.load(d)
    if not prof:
        print(f"no saved profile for this machine and model (it would be {tune_profile.path_for(d)}); run `coli tune`")
        return 0
    m = prof.get("measured") or {}
    print(f"profile {prof['path']}")
    print(f"  knobs     {fmt(prof['knobs']) or '(none: the defaults were best)'}")
    if m:
        print(f"  measured  {m.get('decode_tok_s', 0):.1f} tok/s decode, {m.get('prefill_tok_s', 0):.1f} tok/s prefill")
    return 0
