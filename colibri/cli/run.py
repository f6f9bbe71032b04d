"""`coli run`: one-shot generation to stdout, the prompt as a user message in the model's own
chat template (or --raw text, or --ids token ids)."""
import sys

from colibri import engine_client, launch_opts
from colibri.chat import harmony
from colibri.chat.progress import PromptProgress
from colibri.chat_template import literal as chat_template_literal
from colibri.chat_template import render as chat_template
from colibri.cli.common import parse_ids
from colibri.errors import UserError
from colibri.model.paths import model_arg, require_model

HELP = "one-shot generation to stdout"
EXIT_CONTEXT_FULL = 3  # `coli run` stopped because the context filled up, not at the end of the answer


def add_arguments(r):
    model_arg(r)
    r.add_argument("prompt", nargs="?", help="prompt text (chat template applied unless --raw)")
    r.add_argument("--ids", help="prompt as comma-separated token ids; prints generated ids")
    r.add_argument("--raw", action="store_true", help="send the prompt without the chat template")
    r.add_argument("--stats", action="store_true", help="print the engine's stats line to stderr")
    launch_opts.add_sampling_flags(r)
    launch_opts.add_engine_flags(r, tuple(n for n in launch_opts.LAUNCH_FLAGS if n != "kv-slots"))


def run(args):
    if args.temp is None:  # coli run decodes greedily unless asked to sample
        args.temp = 0.0
    d = require_model(args)
    if args.ids is None and args.prompt is None:
        args.prompt = prompt_from_stdin()
    think = launch_opts.thinking_vars(args, d)
    kw = launch_opts.resolve(args, d)
    opts = launch_opts.sampling_opts(args)
    if args.max_tokens not in (None, -1):  # asked for: the engine refuses it when the prompt leaves less room
        opts["fit"] = 1
    try:
        with engine_client.Engine(d, **kw) as eng:
            if args.ids is not None:
                payload = parse_ids(args.ids)
            else:
                if args.raw:  # the user owns the whole prompt, special-token text included
                    payload = args.prompt
                else:  # the prompt is a user message: its text stays text
                    payload, literal = render_chat_prompt(d, args.prompt, **think).frame()
                    opts.update(literal)
                    if harmony.speaks_harmony(d, eng.info.get("family")):
                        opts["render_special"] = 1  # gpt-oss's channel markup, as <think> shows for others
                opts["special"] = 1
            out_ids, stats = [], {}
            progress = PromptProgress()
            for ev in eng.generate(payload, progress=1 if progress.on else None, **opts):
                progress.event(ev)
                if ev[0] == "data":
                    if ev[1] >= 0:
                        out_ids.append(ev[1])
                    if args.ids is None:
                        sys.stdout.buffer.write(ev[2])
                        sys.stdout.flush()
                elif ev[0] == "end":
                    stats = ev[1]
            if args.ids is not None:
                print(",".join(map(str, out_ids)))
            elif not args.raw:
                print()
            if args.stats:
                budget = launch_opts.budget_line(eng.info, args.batch)
                if budget:
                    print(budget, file=sys.stderr)
                print(" ".join(f"{k}={v}" for k, v in stats.items()), file=sys.stderr)
            ctx = int(eng.info.get("ctx") or 0)
        if context_filled(stats, ctx, args.max_tokens):
            most = int(launch_opts.manifest(d)["arch"]["max_position_embeddings"])
            fix = (f"raise --ctx (this model holds up to {most} positions)" if most > ctx else
                   "that is all this model holds: shorten the prompt")
            print(f"coli run: stopped: the context ({ctx} tokens) is full; {fix}, or give --max-tokens to stop "
                  "earlier", file=sys.stderr)
            return EXIT_CONTEXT_FULL
    except engine_client.EngineError as e:
        if e.kind == "context_exceeded":
            raise UserError(f"{e.message}{launch_opts.larger_ctx_hint(d, args)}") from None
        raise UserError(e.message if e.kind != "engine_died" else str(e)) from None


def prompt_from_stdin():
    """`echo text | coli run --model M`: the prompt is what stdin holds (one trailing newline dropped);
    on a terminal there is nothing to wait for, so say how to give one."""
    how = ('give the prompt as an argument (coli run --model M "text"), on stdin (echo text | coli run '
           '--model M) or as token ids (--ids 1,2,3)')
    if sys.stdin is None or sys.stdin.isatty():
        raise UserError(f"no prompt: {how}")
    raw = sys.stdin.buffer.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"the prompt on stdin is not UTF-8 text (byte {e.start}); convert it, e.g. with iconv") from None
    text = text[:-1] if text.endswith("\n") else text
    if not text.strip():
        raise UserError(f"no prompt: stdin was empty; {how}")
    return text


def context_filled(stats, ctx, max_tokens):
    """True when the END frame's finish=length means the context was full, not --max-tokens reached."""
    if stats.get("finish") != "length" or ctx <= 0:
        return False
    try:
        prompt, done = int(stats.get("prompt_tokens", 0)), int(stats.get("completion_tokens", 0))
    except ValueError:
        return False
    if max_tokens not in (None, -1) and done >= max_tokens:
        return False
    return prompt + done >= ctx


def render_chat_prompt(model_dir, prompt, **extra):
    """The model's own chat template with its own special tokens, as transformers renders it."""
    try:
        return chat_template_literal.render_for_model(model_dir, [{"role": "user", "content": prompt}],
                                                      add_generation_prompt=True, **extra)
    except chat_template.TemplateError as e:
        raise UserError(f"chat template: {e}") from None
