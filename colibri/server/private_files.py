"""Owner-only state: what the server keeps about conversations (the slot table with every
slot's prompt, the engine's KV files) lives in folders of mode 700 and files of mode 600,
whatever the umask. `secure_dir` fixes a state folder and the files already in it at start and
logs each change by name; `write_private` replaces a file atomically with a 600 temporary."""
import os
import stat
import tempfile

DIR_MODE, FILE_MODE = 0o700, 0o600


def make_dir(path):
    """Creates `path` (and parents) with the state folder's mode; returns it."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    return path


def secure_dir(path, log):
    """Makes `path` 700 and every regular file directly in it 600; logs what it changed, and
    what it left alone (symlinks, other owners' files) because it is not ours to fix."""
    _fix(path, DIR_MODE, log, "folder")
    try:
        entries = list(os.scandir(path))
    except OSError as e:
        log(f"cannot list the state folder {path} ({e.strerror}); its files keep their modes")
        return
    for e in entries:
        if e.is_symlink():
            log(f"state file {e.path} is a symlink; left alone (remove it if you did not create it)")
        elif e.is_dir(follow_symlinks=False):
            _fix(e.path, DIR_MODE, log, "folder")
        elif e.is_file(follow_symlinks=False):
            _fix(e.path, FILE_MODE, log, "file")


def _fix(path, mode, log, what):
    try:
        st = os.lstat(path)
        if stat.S_IMODE(st.st_mode) & 0o077 == 0:
            return
        if st.st_uid != os.geteuid():
            log(f"state {what} {path} (mode {stat.S_IMODE(st.st_mode):o}) belongs to another user; "
                f"it stays readable by others: move it away or use --kv-dir")
            return
        new = stat.S_IMODE(st.st_mode) & 0o700
        os.chmod(path, new)
        log(f"made state {what} {path} owner-only (mode {stat.S_IMODE(st.st_mode):o} -> {new:o})")
    except OSError as e:
        log(f"cannot make state {what} {path} owner-only ({e.strerror}); fix its mode by hand (chmod {mode:o})")


def write_private(path, data):
    """Writes bytes `data` to `path` through a 600 temporary beside it (created exclusively,
    so a planted file or symlink is never written through), then renames it into place."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_private(path):
    """The bytes of regular file `path`, refusing symlinks and special files (OSError)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        return f.read()
