#include "kv/kv_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOCK_NAME ".coli_kv.lock"

int kv_dir_lock(const char *dir, char *err, size_t errlen) {
    char path[4200];
    snprintf(path, sizeof path, "%s/" LOCK_NAME, dir);
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot lock the KV directory %s (%s): pass a writable --kv-dir", dir, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        char pid[32];
        int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
        if (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)n, 0) != n) { /* the pid only improves the message */
        }
        return fd;
    }
    int why = errno;
    char holder[32] = "";
    ssize_t got = pread(fd, holder, sizeof holder - 1, 0);
    holder[got > 0 ? got : 0] = 0;
    holder[strcspn(holder, "\n")] = 0;
    close(fd);
    if (why == EWOULDBLOCK) {
        snprintf(err, errlen,
                 "the KV directory %s is in use by another colibri engine%s%s%s; two engines on one directory "
                 "would overwrite each other's slots: give each server or engine its own --kv-dir",
                 dir, *holder ? " (pid " : "", holder, *holder ? ")" : "");
        return KV_DIR_BUSY;
    }
    snprintf(err, errlen, "cannot lock the KV directory %s (%s): pass another --kv-dir", dir, strerror(why));
    return -1;
}

/* .coli_kv.tmp or .coli_kv.<digits>.tmp: the names kv_save writes through. */
static int is_slot_temporary(const char *name) {
    if (strncmp(name, ".coli_kv", 8) != 0) return 0;
    const char *p = name + 8;
    if (*p == '.' && p[1] >= '0' && p[1] <= '9') {
        p++;
        while (*p >= '0' && *p <= '9') p++;
    }
    return strcmp(p, ".tmp") == 0;
}

int kv_dir_clean(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_slot_temporary(e->d_name)) continue;
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (lstat(path, &st) || S_ISDIR(st.st_mode)) continue;
        if (unlink(path) == 0) {
            fprintf(stderr, "colibri: removed %s (%.1f MB), left by a save that was interrupted\n", path,
                    (double)st.st_size / 1e6);
            removed++;
        } else {
            fprintf(stderr, "colibri: warning: cannot remove the stale temporary %s: %s\n", path, strerror(errno));
        }
    }
    closedir(d);
    return removed;
}
