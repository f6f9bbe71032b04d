"""`coli chat`: the thinking splitter, piped conversations (no terminal), engine death, and a real
terminal session driven through tmux."""
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher_helpers import CHATML, ROOT, THINK_TEMPLATE, clean_env, coli, convert_tiny

from colibri.cli import chat as chat_cli


# chat samples by default; tests that count an answer's tokens, or need an answer long enough to
# interrupt, decode greedily so that a sampled end-of-text token cannot cut the answer short
GREEDY = ("--temp", "0")


@pytest.fixture(scope="module")
def model(oracle_root, tmp_path_factory):
    return convert_tiny(oracle_root, tmp_path_factory.mktemp("chat") / "moe", template=CHATML)


# ---------------------------------------------------------------- units

def split_all(pieces, thinking=False):
    s = chat_cli.ThinkSplitter(True, in_reasoning=thinking, marks=True)
    out = []
    for p in pieces:
        out += s.feed(p)
    out += s.flush()
    merged = []
    for ev in out:  # join adjacent text of one kind, as the screen would show it
        if merged and len(ev) == 2 and len(merged[-1]) == 2 and merged[-1][0] == ev[0]:
            merged[-1] = (ev[0], merged[-1][1] + ev[1])
        else:
            merged.append(ev)
    return merged


def test_think_tags_split_across_pieces():
    text = "<think>\nhmm, let me see</think>\n\nThe answer is 4."
    for cut in range(1, len(text)):
        ev = split_all([text[:cut], text[cut:]])
        assert ev == [("think_start",), ("reasoning", "\nhmm, let me see"), ("think_end",),
                      ("content", "The answer is 4.")], cut


def test_a_template_that_opens_think_starts_inside_it():
    assert split_all(["reasoning", "</thi", "nk>done"], thinking=True) == \
        [("reasoning", "reasoning"), ("think_end",), ("content", "done")]


def test_think_tag_inside_an_answer_is_text():
    assert split_all(["Use the <think> tag", " like <think>this"]) == \
        [("content", "Use the <think> tag like <think>this")]


def test_an_unfinished_tag_is_flushed_as_text():
    assert split_all(["a <", "thi"]) == [("content", "a <thi")]


def test_a_continued_answer_keeps_a_leading_think_tag_as_text():
    s = chat_cli.ThinkSplitter(True, answered=True, marks=True)
    assert s.feed("<think>x") + s.flush() == [("content", "<think>x")]


def test_opens_thinking():
    assert chat_cli.opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not chat_cli.opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not chat_cli.opens_thinking("<|im_start|>assistant\n")


def test_footer():
    f = chat_cli.footer({"completion_tokens": "12", "decode_tok_s": "25.34", "ttft_ms": "120.2", "prompt_tokens": "40",
                         "reused_tokens": "30", "hit_rate": "0.875", "rss_mb": "512", "finish": "length"}, False)
    assert f == "[12 tokens, 25.3 tok/s, TTFT 120 ms, prompt 40 (30 reused), hit rate 88%, RSS 512 MB, " \
                "cut at the cap: :more continues]"
    assert chat_cli.footer({"finish": "stop"}, True).endswith("stopped]")


def test_footer_says_when_the_context_filled_not_the_cap():
    """An answer cut because the context is full cannot be continued with :more: the footer says
    so instead of pointing at the cap."""
    stats = {"completion_tokens": "472", "prompt_tokens": "40", "finish": "length"}
    f = chat_cli.footer(stats, False, ctx=512)
    assert f.endswith("the context is full (512 tokens): :reset starts over, or restart with a larger --ctx]")
    assert chat_cli.footer(dict(stats, completion_tokens="100"), False, ctx=512).endswith(":more continues]")


def test_footer_shows_streamed_experts():
    f = chat_cli.footer({"completion_tokens": "8", "decode_tok_s": "3.0", "ttft_ms": "900", "prompt_tokens": "20",
                         "reused_tokens": "0", "hit_rate": "0.250", "bytes_read": "734000000", "read_gbps": "1.53",
                         "io_wait_ms": "480.4", "rss_mb": "90", "peak_rss_mb": "97", "finish": "stop"}, False)
    assert "hit rate 25%, read 734 MB at 1.53 GB/s, I/O wait 480 ms, RSS 90 MB (peak 97)" in f


# ---------------------------------------------------------------- piped (no terminal)

def test_piped_conversation_with_more_and_reset(model):
    r = coli("chat", "--model", model, "--max-tokens", "8", *GREEDY,
             input="What is two plus two?\n:more\n:reset\nAnd three?\n:quit\n")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "\033" not in out  # no escape codes when stdout is not a terminal
    assert out.startswith("ready: ") and "loaded in" in out and "MB resident" in out
    footers = [ln for ln in out.splitlines() if ln.startswith("[") and "tok/s" in ln]
    assert len(footers) == 3, out
    assert all("8 tokens" in f and "cut at the cap" in f for f in footers)
    # :more continues from the engine's KV: at least the whole first prompt is reused (the random
    # model's invalid UTF-8 output re-tokenizes differently, so not necessarily its answer)
    first_prompt = int(footers[0].split("prompt ")[1].split(" ")[0])
    reused = int(footers[1].split("(")[1].split(" reused")[0])
    assert reused >= first_prompt
    assert "(conversation cleared)" in out


def test_second_turn_reuses_the_first(model):
    r = coli("chat", "--model", model, "--max-tokens", "4", *GREEDY, input="Hi\nHow are you?\n")
    footers = [ln for ln in r.stdout.splitlines() if "tok/s" in ln]
    assert len(footers) == 2
    assert "(0 reused)" in footers[0] and "(0 reused)" not in footers[1]


def test_multi_line_block_is_one_message(model):
    r = coli("chat", "--model", model, "--max-tokens", "3", input='"""\nline one\nline two\n"""\n')
    assert r.returncode == 0 and sum("tok/s" in ln for ln in r.stdout.splitlines()) == 1


def test_thinking_is_rendered_apart(model, tmp_path):
    d = tmp_path / "think"
    shutil.copytree(model, d)
    (d / "chat_template.jinja").write_text(THINK_TEMPLATE)
    r = coli("chat", "--model", d, "--max-tokens", "6", input="Think about it.\n")
    assert r.returncode == 0, r.stderr
    assert "[thinking]" in r.stdout and "\033" not in r.stdout
    r = coli("chat", "--model", d, "--max-tokens", "6", "--no-think", input="Answer now.\n")
    assert r.returncode == 0 and "[thinking]" not in r.stdout and "thinking off" in r.stdout


def test_control_characters_in_the_answer_reach_the_terminal_as_visible_symbols():
    """A sampled token may hold ESC or CR; written raw it would recolour, move or retitle the
    user's terminal, so the screen shows symbols instead, with or without a terminal."""
    for color in (False, True):
        out = io.StringIO()
        screen = chat_cli.Screen(out, color)
        screen.event(("think_start",))
        screen.event(("reasoning", "r\x1b]0;title\x07"))
        screen.event(("think_end",))
        screen.event(("content", "a\x1b[31mb\rc\td\n\x7f\x9b\u00e9"))
        screen.event(("tool_call", {"name": "f\x1b", "arguments": {}}))
        text = out.getvalue()
        own_codes = ("\033[2m", "\033[22m") if color else ()
        for code in own_codes:
            text = text.replace(code, "")
        assert not any(ch in text for ch in "\x1b\x07\r\x7f\x9b"), repr(text)
        assert "a\u241b[31mb\u240dc\td\n\u2421\\x9b\u00e9" in text and "r\u241b]0;title\u2407" in text
        assert "[f\u241b({})]" in text


def test_commands_and_unknown_commands(model):
    r = coli("chat", "--model", model, input=":help\n:bogus\n:more\n:think on\n")
    assert r.returncode == 0
    assert ":reset" in r.stdout and "unknown command :bogus" in r.stdout
    assert "nothing to continue" in r.stdout and "no thinking switch" in r.stdout


def test_context_overflow_is_explained_and_the_chat_goes_on(model):
    long = "word " * 600
    r = coli("chat", "--model", model, "--max-tokens", "2", *GREEDY, input=f"{long}\nshort\n")
    assert r.returncode == 0
    assert "no longer fits the context" in r.stdout and ":reset" in r.stdout
    assert sum("tok/s" in ln for ln in r.stdout.splitlines()) == 1


def test_refusals_before_the_engine_starts(model, tmp_path, oracle_root):
    r = coli("chat", "--model", model, "--think")
    assert r.returncode == 2 and "no thinking switch" in r.stderr
    r = coli("chat", "--model", model, "--cap", "99")
    assert r.returncode == 2 and "give 1 to" in r.stderr
    d = tmp_path / "notemplate"
    shutil.copytree(model, d)
    (d / "chat_template.jinja").unlink()
    r = coli("chat", "--model", d)
    assert r.returncode == 2 and "--raw" in r.stderr
    r = coli("chat", "--model", d, "--raw", "--max-tokens", "3", *GREEDY, input="Once upon a time\n")
    assert r.returncode == 0 and "3 tokens" in r.stdout
    for bad, msg in ((tmp_path / "nope", "no such directory"), (tmp_path, "colibri.json"),
                     (Path(oracle_root) / "qwen3_moe" / "hf", "coli convert")):
        r = coli("chat", "--model", bad)
        assert r.returncode == 2 and msg in r.stderr
    r = coli("chat")
    assert r.returncode == 2 and "COLI_MODEL" in r.stderr


def engine_child(pid, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.05)
    raise AssertionError("the chat started no engine")


def test_engine_death_is_explained(model):
    p = subprocess.Popen([sys.executable, str(ROOT / "coli"), "chat", "--model", str(model), "--max-tokens", "4"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=clean_env())
    try:
        assert p.stdout.readline().startswith("ready:")
        os.kill(engine_child(p.pid), signal.SIGKILL)
        time.sleep(0.2)
        out, err = p.communicate("hello\n", timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1
    assert "SIGKILL" in err and "out-of-memory" in err


# ---------------------------------------------------------------- a real terminal (tmux)

class Tmux:
    def __init__(self, name, command, env):
        self.name = name
        exports = " ".join(f"{k}='{v}'" for k, v in env.items())
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "160", "-y", "50",
                        f"cd '{ROOT}' && env {exports} {command}; echo EXITED=$?; sleep 60"], check=True)

    def keys(self, *keys):
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def screen(self):
        return subprocess.run(["tmux", "capture-pane", "-p", "-S", "-", "-t", self.name],
                              capture_output=True, text=True).stdout

    def wait_for(self, pred, timeout=20, step=0.03):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.screen()
            if pred(s):
                return s
            time.sleep(step)
        raise AssertionError(f"timed out; the screen:\n{self.screen()}")

    def close(self):
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)

    def engine_pid(self):
        """The engine process under the pane (shell -> coli -> build/colibri)."""
        pid = int(subprocess.run(["tmux", "display", "-p", "-t", self.name, "#{pane_pid}"],
                                 capture_output=True, text=True).stdout)
        todo = [pid]
        while todo:
            p = todo.pop()
            try:
                if b"build/colibri" in Path(f"/proc/{p}/cmdline").read_bytes():
                    return p
                todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
            except OSError:
                pass
        raise AssertionError("no engine process under the tmux pane")


def test_chat_in_a_terminal(model, tmp_path):
    if not shutil.which("tmux"):
        pytest.fail("tmux is not installed: the terminal test of `coli chat` needs it "
                    "(apt-get install -y tmux; .ci/run should install it)", pytrace=False)
    history = tmp_path / "history"
    env = {"COLI_HISTORY": str(history), "TERM": "xterm-256color", "COLI_PROFILE_DIR": str(tmp_path / "p")}
    t = Tmux(f"coli-chat-{os.getpid()}", f"{sys.executable} ./coli chat --model '{model}' {' '.join(GREEDY)}", env)
    try:
        t.wait_for(lambda s: "ready:" in s and any(ln.startswith(">") for ln in s.splitlines()))
        t.keys("Tell me a long story", "Enter")
        # streamed: the answer grows on screen before it ends
        engine = t.engine_pid()
        first = t.wait_for(lambda s: len(s.split("Tell me a long story", 1)[-1].strip()) > 20, step=0.01)
        # hold the engine still so the Ctrl-C surely lands mid-answer, whatever the machine's speed
        os.kill(engine, signal.SIGSTOP)
        try:
            t.keys("C-c")
            time.sleep(0.3)
        finally:
            os.kill(engine, signal.SIGCONT)
        s = t.wait_for(lambda s: "stopped]" in s)
        answer = first.split("Tell me a long story", 1)[1]
        assert "tok/s" not in answer  # the first capture was mid-answer, before the footer
        footer = next(ln for ln in s.splitlines() if "stopped]" in ln)
        assert "TTFT" in footer and "hit rate" in footer and "RSS" in footer
        # the engine stopped before the answer cap (a tiny model streams hundreds of tokens before
        # the screen capture notices the answer, so only the cap is a machine-independent bound)
        assert int(footer.strip("[").split(" tokens")[0]) < chat_cli.DEFAULT_ANSWER_CAP
        t.keys(":reset", "Enter")
        t.wait_for(lambda s: "(conversation cleared)" in s)
        # a pasted block arrives as several lines at once: one message, one answer
        after_reset = lambda s: s.rsplit("(conversation cleared)", 1)[-1]  # noqa: E731
        t.keys("-l", "first pasted line\nsecond pasted line\n")
        t.wait_for(lambda s: after_reset(s).count("tok/s") >= 1)
        time.sleep(1.5)
        s = after_reset(t.screen())
        assert "first pasted line\nsecond pasted line" in s and "> second pasted line" not in s
        assert s.count("tok/s") == 1
        t.keys("C-c")
        t.wait_for(lambda s: "Ctrl-C again" in s)
        t.keys(":quit", "Enter")
        s = t.wait_for(lambda s: "EXITED=" in s)
        assert "EXITED=0" in s and "Traceback" not in s
        assert "Tell me a long story" in history.read_text()  # readline history was saved
    finally:
        t.close()
