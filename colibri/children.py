"""The launcher's child processes (engines, tokenizer helpers): each runs in a session of its
own, so a terminal's Ctrl-C or a signal to the launcher's group does not reach it, and the
launcher must end it itself before it exits. `register` records one; `end_all` kills every one
still running and waits until each has exited, bounded; safe to call from a signal handler (no
locks: the list is appended to and copied, both atomic)."""
import os
import signal
import time

_procs = []


def register(proc):
    """Records a subprocess.Popen; returns it."""
    _procs[:] = [p for p in _procs if p.returncode is None]
    _procs.append(proc)
    return proc


def _gone(pid):
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped already (by its Popen)
        return True
    return done == pid


def end_all(timeout=10.0):
    """SIGKILLs every registered process that is still running and waits up to `timeout` s in
    all for them to exit; returns the pids still running then (normally none)."""
    left = []
    for p in list(_procs):
        if p.returncode is not None:
            continue
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        left.append(p.pid)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if not _gone(pid)]
        if left:
            time.sleep(0.01)
    return left
