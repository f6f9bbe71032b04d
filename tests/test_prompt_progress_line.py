"""The terminal's prompt-progress line (colibri/cli/progress.py): shown only on a terminal, only
once a prompt has taken a few seconds, and cleared when the first token arrives."""
import io

from colibri.chat.progress import PromptProgress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_line_after_a_few_seconds_then_cleared():
    out = Tty()
    p = PromptProgress(out, show_after_ms=2000)
    p.event(("progress", 512, 4096, 0, 900.0))  # too soon: nothing
    assert out.getvalue() == ""
    p.event(("progress", 1024, 4096, 0, 2500.0))
    assert out.getvalue() == "\r\033[Kprompt 1024/4096 positions (25%), 410/s"
    p.event(("progress", 4096, 4096, 0, 9000.0))  # done: the line goes
    p.event(("data", 7, b"x"))
    assert out.getvalue().endswith("\r\033[K") and out.getvalue().count("\r\033[K") == 2


def test_reused_positions_do_not_count_in_the_rate():
    out = Tty()
    PromptProgress(out, show_after_ms=0).event(("progress", 3000, 5000, 2000, 2000.0))
    assert out.getvalue().endswith("prompt 3000/5000 positions (60%), 500/s")


def test_nothing_on_a_pipe():
    out = io.StringIO()
    p = PromptProgress(out, show_after_ms=0)
    assert not p.on
    p.event(("progress", 1, 10, 0, 5000.0))
    p.event(("data", 1, b""))
    assert out.getvalue() == ""
