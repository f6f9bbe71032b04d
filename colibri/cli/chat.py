"""`coli chat`: a terminal conversation with one engine process, loaded once.

Each turn renders the whole conversation with the model's chat template and sends it to KV
slot 0, so the engine reuses the common prefix and only the new text is prefilled. Tokens are
printed as they arrive; thinking (<think>...</think>, or gpt-oss's analysis channel) is shown
apart (dimmed on a terminal).
Ctrl-C sends STOP for the current answer; a second Ctrl-C leaves. Without a terminal no escape
codes are written and each input line is one message.
"""
import codecs
import json
import os
import select
import signal
import sys
import time
from pathlib import Path

from colibri import launch_opts
from colibri.errors import UserError
from colibri.model.paths import model_arg, require_model
from colibri.chat import harmony
from colibri.chat.progress import PromptProgress
from colibri.chat.text import ThinkSplitter  # the server's splitters: one rule for reasoning everywhere
from colibri import engine_client
from colibri import sampling
from colibri.chat_template import literal as chat_template_literal
from colibri.chat_template import render as chat_template

HELP = "chat with a model in the terminal (streams tokens; Ctrl-C stops an answer)"
DESCRIPTION = """Loads the model once and chats. Commands:
  :reset         forget the conversation          :more    continue an answer cut at the cap
  :system TEXT   set the system prompt (resets)   :think on|off  switch thinking (if the model has it)
  :effort low|medium|high  how much gpt-oss reasons (its reasoning_effort)
  :help          this list                        :quit    leave (also Ctrl-D, or Ctrl-C twice)
Multi-line input: paste it, or type \"\"\" on a line, the text, then \"\"\" again.
Ctrl-C stops the current answer; a second Ctrl-C leaves."""

DEFAULT_ANSWER_CAP = 1024  # per answer, when the registry names no interactive cap; :more continues
COMMANDS = {":reset", ":more", ":system", ":think", ":effort", ":help", ":quit", ":exit", ":q"}

# The model's text goes to a terminal: a control character in it (ESC, CR, a C1 code) could move
# the cursor, recolour or retitle the user's terminal, so each is shown as its visible symbol
# (U+2400 block for C0 and DEL, \x.. for C1). Newline and tab pass.
VISIBLE_CONTROLS = {c: chr(0x2400 + c) for c in range(0x20) if c not in (0x09, 0x0A)}
VISIBLE_CONTROLS[0x7F] = "\u2421"
VISIBLE_CONTROLS.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})


def visible(text):
    """The model's text with its control characters made visible (VISIBLE_CONTROLS)."""
    return text.translate(VISIBLE_CONTROLS)


class Screen:
    """Writes the answer stream; escape codes only on a terminal."""

    def __init__(self, out, color):
        self.out, self.color = out, color
        self.after_think = False

    def write(self, text):
        self.out.write(text)
        self.out.flush()

    def event(self, ev):
        kind = ev[0]
        if kind == "think_start":
            self.write("\033[2m" if self.color else "[thinking]\n")
        elif kind == "think_end":
            self.write("\033[22m\n" if self.color else "\n[/thinking]\n")
            self.after_think = True
        elif kind == "reasoning":
            self.write(visible(ev[1]))
        elif kind == "tool_call":  # gpt-oss calling a function nobody offered: show it as text
            self.write(visible(f"[{ev[1]['name']}({json.dumps(ev[1]['arguments'], ensure_ascii=False)})]"))
        else:
            text = ev[1]
            if self.after_think:  # the blank lines a template puts after </think>
                text = text.lstrip("\n")
                self.after_think = not text
            self.write(visible(text))

    def dim(self, text):
        return f"\033[2m{text}\033[22m" if self.color else text

    def reset(self):
        if self.color:
            self.write("\033[0m")


def opens_thinking(text):
    """True when text (the template's generation prompt, plus an unfinished answer for :more)
    leaves the model inside <think>."""
    return text.rfind("<think>") > text.rfind("</think>")


def in_reasoning(splitter):
    """True while the splitter is inside a reasoning block (<think> or an analysis message)."""
    if isinstance(splitter, harmony.HarmonySplitter):
        return splitter.state == "body" and splitter.kind == "reasoning"
    return splitter.state == "reasoning"


def switch_thinking(template_vars, model_dir, word):
    """:think on|off: sets the family's own switch (DeepSeek's `thinking`, most others'
    enable_thinking; a template that reads both lets `thinking` win). Returns the note to print."""
    switch = launch_opts.thinking_switch(model_dir)
    if switch not in template_vars and not launch_opts.template_supports_thinking(model_dir):
        return "this model's chat template has no thinking switch"
    if word not in ("on", "off"):
        return ":think on, or :think off"
    template_vars[switch] = word == "on"
    return f"thinking {word}"


def reads_effort(model_dir):
    """True when the model's chat template reads reasoning_effort (gpt-oss's does)."""
    try:
        return "reasoning_effort" in chat_template.load_chat_template(str(model_dir))
    except Exception:  # noqa: BLE001 - no readable template
        return False


def switch_effort(template_vars, model_dir, word):
    """:effort low|medium|high (and --reasoning-effort): gpt-oss's reasoning_effort. Returns the note."""
    if not reads_effort(model_dir):
        return "this model's chat template has no reasoning effort"
    why = harmony.effort_error(word)
    if why:
        return ":effort low, :effort medium or :effort high"
    template_vars["reasoning_effort"] = word
    return f"reasoning effort {word}"


def thinking_note(template_vars):
    """The ready line's thinking part for --think/--no-think, whatever the switch is called."""
    note = ""
    switches = {k: v for k, v in template_vars.items() if k != "reasoning_effort"}
    if switches:
        note = f"; thinking {'on' if any(switches.values()) else 'off'}"
    if "reasoning_effort" in template_vars:
        note += f"; reasoning effort {template_vars['reasoning_effort']}"
    return note


def footer(stats, stopped, ctx=None):
    f = lambda k, d=0.0: float(stats.get(k, d) or d)  # noqa: E731
    parts = [f"{int(f('completion_tokens'))} tokens", f"{f('decode_tok_s'):.1f} tok/s", f"TTFT {f('ttft_ms'):.0f} ms",
             f"prompt {int(f('prompt_tokens'))} ({int(f('reused_tokens'))} reused)",
             f"hit rate {f('hit_rate', 1.0):.0%}"]
    if f("bytes_read") > 0:  # experts streamed this turn
        parts.append(f"read {f('bytes_read') / 1e6:.0f} MB at {f('read_gbps'):.2f} GB/s, "
                     f"I/O wait {f('io_wait_ms'):.0f} ms")
    parts.append(f"RSS {int(f('rss_mb'))} MB" + (f" (peak {int(f('peak_rss_mb'))})" if "peak_rss_mb" in stats else ""))
    if stopped:
        parts.append("stopped")
    elif stats.get("finish") == "length" and ctx and f("prompt_tokens") + f("completion_tokens") >= ctx:
        parts.append(f"the context is full ({ctx} tokens): :reset starts over, or restart with a larger --ctx")
    elif stats.get("finish") == "length":
        parts.append("cut at the cap: :more continues")
    return "[" + ", ".join(parts) + "]"


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class Chat:
    def __init__(self, args, model_dir, engine, template_vars, out=sys.stdout):
        self.args, self.dir, self.eng = args, model_dir, engine
        self.vars = template_vars
        self.system = args.system
        self.messages = []
        self.last = None  # (prompt, generation prompt, answer so far) of an unfinished answer, for :more
        self.stopped = False
        self.color = out.isatty() and os.environ.get("NO_COLOR") is None and os.environ.get("TERM") != "dumb"
        self.screen = Screen(out, self.color)
        fam = engine.info.get("family")
        cap = None
        try:
            import family_registry
            cap = family_registry.FAMILIES.get(fam, {}).get("interactive_max_tokens")
        except ImportError:
            pass
        ctx = int(engine.info.get("ctx", 0)) or DEFAULT_ANSWER_CAP + 1
        self.ctx = int(engine.info.get("ctx", 0)) or None
        self.cap = args.max_tokens if args.max_tokens is not None else min(cap or DEFAULT_ANSWER_CAP, ctx - 1)
        self.defaults, self.default_sources = sampling.model_defaults(model_dir)
        self.opts = launch_opts.sampling_opts(args, defaults=self.defaults)
        self.opts.pop("max_tokens", None)
        # gpt-oss: the channel markup is special tokens, so the engine writes them out
        self.harmony = not args.raw and harmony.speaks_harmony(model_dir, fam)
        if self.harmony:
            self.opts["render_special"] = 1
        self.answer_content = ""  # the last answer without its reasoning (what the template gets back)

    def sampling_line(self):
        """What this chat samples with: the flags given, the model's defaults for the rest."""
        given = {k for k in sampling.API_NAMES if getattr(self.args, k, None) is not None}
        values = {k: self.opts[k] for k in sampling.API_NAMES if k in self.opts}
        sources = {k: "flag" if k in given else self.default_sources.get(k, "engine") for k in values}
        return sampling.describe(values, sources)

    # -------------------------------------------------------------- prompt text

    def conversation(self):
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.messages

    def render(self, add_generation_prompt=True):
        """The prompt as a chat_template_literal.Prompt: what the user typed stays text."""
        if self.args.raw:  # plain text continuation: the messages one after another (the user owns it all)
            return chat_template_literal.Prompt(
                "".join(m["content"] + ("\n" if m["role"] == "user" else "") for m in self.conversation()))
        return chat_template_literal.render_for_model(str(self.dir), self.conversation(),
                                                      add_generation_prompt=add_generation_prompt, **self.vars)

    def generation_prompt(self, payload):
        """What the template appended for the assistant turn (e.g. '<|im_start|>assistant\\n<think>\\n')."""
        try:
            base = self.render(add_generation_prompt=False)
        except Exception:  # noqa: BLE001 - some templates refuse a conversation ending with a user turn
            return ""
        return payload.text[len(base.text):] if payload.text.startswith(base.text) else ""

    # -------------------------------------------------------------- one answer

    def answer(self, payload, think_context, continuing=False):
        """Streams one answer; returns (text, finish or EngineError, stopped). Ctrl-C sends STOP, a
        second one leaves. payload: a Prompt. think_context: the generation prompt (+ the answer so
        far for :more)."""
        self.stopped = False
        rid = self.eng.new_id()
        state = {"stopping": False}

        def on_sigint(_sig, _frame):
            if state["stopping"]:
                raise KeyboardInterrupt
            state["stopping"] = True
            self.eng.control("STOP", rid)

        if self.harmony:  # the whole prompt (+ answer so far) says which channel the model is in
            splitter = harmony.HarmonySplitter.after_prompt(payload.text, marks=True)
        else:
            splitter = ThinkSplitter(True, in_reasoning=opens_thinking(think_context), answered=continuing, marks=True)
        if in_reasoning(splitter):
            self.screen.event(("think_start",))
        content = []
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces, stats = [], {}
        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            from colibri import engine_client
            try:
                body, literal = payload.frame()
                progress = PromptProgress()
                for ev in self.eng.generate(body, rid=rid, slot=0, special=1, max_tokens=self.cap, **literal,
                                            progress=1 if progress.on else None, **self.opts):
                    progress.event(ev)
                    if ev[0] == "data":
                        text = decoder.decode(ev[2])
                        pieces.append(text)
                        for out in splitter.feed(text):
                            self.screen.event(out)
                            if out[0] == "content":
                                content.append(out[1])
                    elif ev[0] == "end":
                        stats = ev[1]
            except engine_client.EngineError as e:
                if e.kind == "engine_died":
                    raise
                self.screen.reset()
                self.screen.write("\n")
                return None, e, state["stopping"]
            tail = decoder.decode(b"", final=True)
            pieces.append(tail)
            for out in splitter.feed(tail) + splitter.flush():
                self.screen.event(out)
                if out[0] == "content":
                    content.append(out[1])
        finally:
            signal.signal(signal.SIGINT, previous)
            self.screen.reset()
        self.answer_content = "".join(content)
        if in_reasoning(splitter) and not self.harmony:  # harmony's flush already closed the block
            self.screen.write("\n" if self.color else "\n[/thinking]\n")
        self.screen.write("\n")
        self.screen.write(self.screen.dim(footer(stats, state["stopping"] and stats.get("finish") == "stop", self.ctx)) + "\n")
        self.stopped = state["stopping"]
        return "".join(pieces), stats.get("finish"), state["stopping"]

    # -------------------------------------------------------------- turns and commands

    def say(self, text):
        self.messages.append({"role": "user", "content": text})
        try:
            payload = self.render()
            payload.frame()  # text that is not valid Unicode fails here, before the answer starts
        except Exception as e:  # noqa: BLE001 - TemplateError names the template problem
            self.messages.pop()
            self.note(f"the chat template failed: {e}")
            return
        gen = self.generation_prompt(payload)
        text, finish, stopped = self.answer(payload, gen)
        if text is None:
            self.messages.pop()
            self.explain(finish)
            return
        # gpt-oss's template refuses channel markup in content and drops earlier analysis anyway
        self.messages.append({"role": "assistant", "content": self.answer_content if self.harmony else text})
        self.last = (payload, gen, text) if (finish == "length" or stopped) else None

    def more(self):
        if not self.last:
            self.note("nothing to continue: :more continues an answer cut at the cap or stopped with Ctrl-C")
            return
        prompt, gen, so_far = self.last
        # the engine's KV already holds prompt + answer: only the new tokens are computed
        # the answer so far is the model's own output: appended after the spans, which stay valid
        text, finish, stopped = self.answer(chat_template_literal.Prompt(prompt.text + so_far, prompt.literal),
                                            gen + so_far, continuing=True)
        if text is None:
            self.explain(finish)
            return
        self.messages[-1]["content"] += self.answer_content if self.harmony else text
        self.last = (prompt, gen, so_far + text) if (finish == "length" or stopped) else None

    def explain(self, err):
        if err.kind == "context_exceeded":
            self.note(f"{err.message}. The conversation no longer fits the context: :reset starts over "
                      "(or restart with a larger --ctx)")
        else:
            self.note(f"the engine refused the turn ({err.kind}): {err.message}")

    def note(self, text):
        self.screen.write(self.screen.dim(f"({text})") + "\n")

    def command(self, line):
        """Returns False to leave."""
        word, _, rest = line.partition(" ")
        if word in (":quit", ":exit", ":q"):
            return False
        if word == ":reset":
            self.messages, self.last = [], None
            self.note("conversation cleared")
        elif word == ":more":
            self.more()
        elif word == ":system":
            self.system = rest.strip() or None
            self.messages, self.last = [], None
            self.note("system prompt " + ("set" if self.system else "cleared") + "; conversation cleared")
        elif word == ":think":
            self.note(switch_thinking(self.vars, self.dir, rest.strip()))
        elif word == ":effort":
            self.note(switch_effort(self.vars, self.dir, rest.strip()))
        else:
            self.screen.write(DESCRIPTION.split("\n", 1)[1] + "\n")
        return True


# ------------------------------------------------------------------ input

def read_message(interactive):
    """One message: a line, a pasted block, or a \"\"\" block. Raises EOFError / KeyboardInterrupt."""
    prompt = "> " if interactive else ""
    line = input(prompt)
    if line.strip() == '"""':
        lines = []
        while True:
            nxt = input("... " if interactive else "")
            if nxt.strip() == '"""':
                return "\n".join(lines)
            lines.append(nxt)
    lines = [line]
    # a paste without bracketed-paste mode arrives as several lines at once: keep them together
    while interactive and select.select([sys.stdin], [], [], 0.03)[0]:
        try:
            lines.append(input(""))
        except EOFError:
            break
    return "\n".join(lines)


def setup_history():
    """readline history in $COLI_HISTORY (empty: none), default $XDG_CACHE_HOME/colibri/chat_history."""
    try:
        import readline
    except ImportError:
        return None
    path = os.environ.get("COLI_HISTORY")
    if path is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "colibri", "chat_history")
    if not path:
        return None
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(2000)
    return path


def save_history(path):
    if not path:
        return
    import readline
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        readline.write_history_file(path)
    except OSError:
        pass


# ------------------------------------------------------------------ command

def add_arguments(p):
    import argparse
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    model_arg(p)
    p.add_argument("--system", help="system prompt")
    p.add_argument("--raw", action="store_true", help="no chat template: the conversation is plain text that the "
                   "model continues (for base models)")
    p.add_argument("--reasoning-effort", choices=harmony.EFFORTS, help="how much the model reasons, for templates "
                   "that read reasoning_effort (gpt-oss); :effort changes it")
    launch_opts.add_engine_flags(p, tuple(n for n in launch_opts.LAUNCH_FLAGS if n != "kv-slots"))
    launch_opts.add_sampling_flags(p, max_tokens_help=f"cap per answer (default {DEFAULT_ANSWER_CAP}, or the "
                                   "family's interactive cap); :more continues a capped answer",
                                   model_defaults=True)


def run(args):
    d = require_model(args)
    if not args.raw and launch_opts.template_supports_thinking(d) is None:
        raise UserError(f"{d} has no chat template (chat_template.jinja or tokenizer_config.json's chat_template); "
                        "copy it from the source checkpoint, or chat without one: coli chat --raw")
    template_vars = launch_opts.thinking_vars(args, d)
    if getattr(args, "reasoning_effort", None):
        if args.raw or not reads_effort(d):
            raise UserError("--reasoning-effort: this model's chat template does not read reasoning_effort"
                            + (" (and --raw uses no template)" if args.raw else ""))
        template_vars["reasoning_effort"] = args.reasoning_effort
    kw = launch_opts.resolve(args, d)
    interactive = sys.stdin.isatty()
    if sys.stderr.isatty():
        sys.stderr.write(f"loading {d} ...")
        sys.stderr.flush()
    t0 = time.monotonic()
    # The terminal sends Ctrl-C to the whole foreground process group; an ignored signal stays
    # ignored across exec, so the engine never dies of it: Ctrl-C becomes STOP, sent by us.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        eng = engine_client.Engine(d, ctx=kw["ctx"], threads=kw["threads"], batch=kw["batch"], kv=kw["kv"],
                                   spin=kw["spin"], extra=kw["extra"])
    except engine_client.EngineError as e:
        if sys.stderr.isatty():
            sys.stderr.write("\n")
        raise UserError(f"the engine could not load {d}: {e.message}") from None
    finally:
        signal.signal(signal.SIGINT, previous)
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    load_s = time.monotonic() - t0
    history = setup_history() if interactive else None
    try:
        info = eng.info
        if info.get("tokenizer") != "1":
            raise UserError(f"{d} has no tokenizer.json, which chat needs; copy it from the source checkpoint")
        chat = Chat(args, d, eng, template_vars)
        rss = rss_mb(eng.proc.pid)
        print(f"ready: {Path(d).name} ({info.get('family')}), context {info.get('ctx')}, {info.get('threads')} threads, "
              f"{info.get('kernels')} kernels; loaded in {load_s:.2f} s, {rss if rss is not None else '?'} MB resident"
              + thinking_note(template_vars))
        budget = launch_opts.budget_line(info, args.batch)
        if budget:
            print(chat.screen.dim(budget))
        print(chat.screen.dim("sampling: " + chat.sampling_line()))
        if interactive:
            print(chat.screen.dim(":help lists commands; Ctrl-C stops an answer, Ctrl-D leaves"))
        sys.stdout.flush()
        return loop(chat, interactive)
    except engine_client.EngineError as e:
        print(f"\ncoli chat: {e.message}", file=sys.stderr)
        return 1
    finally:
        save_history(history)
        eng.close()


def loop(chat, interactive):
    armed = False  # a Ctrl-C just happened: the next one leaves
    while True:
        try:
            text = read_message(interactive)
        except EOFError:
            if interactive:
                print()
            return 0
        except KeyboardInterrupt:
            if armed:
                print()
                return 0
            armed = True
            print("\n" + chat.screen.dim("(Ctrl-C again, :quit or Ctrl-D leaves)"))
            continue
        armed = chat.stopped = False
        stripped = text.strip()
        if not stripped:
            continue
        try:
            if stripped.startswith(":") and stripped.split()[0] in COMMANDS:
                if not chat.command(stripped):
                    return 0
            elif stripped.startswith(":") and not stripped[1:2].isspace() and stripped[1:2].isalpha():
                chat.note(f"unknown command {stripped.split()[0]}; :help lists them (start the line with a space "
                          "to send it as a message)")
            else:
                chat.say(text.strip("\n"))
        except KeyboardInterrupt:  # a second Ctrl-C during an answer
            print()
            return 0
        armed = chat.stopped  # an answer stopped with Ctrl-C: the next Ctrl-C leaves
