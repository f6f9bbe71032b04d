/* The byte-moving half of `coli convert`: the Python side plans every tensor and writes the
 * headers; this executes "read rows of a source tensor, re-encode, write at an offset" jobs
 * with bounded memory (one chunk of rows at a time). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf_quants.h"
#include "quant.h"

#define CHUNK_BYTES (32u << 20)

static int src_elem(const char *dt) {
    if (!strcmp(dt, "F32")) return 4;
    if (!strcmp(dt, "F16") || !strcmp(dt, "BF16")) return 2;
    return 0;
}

static void to_f32(const char *dt, const unsigned char *src, long long n, float *dst) {
    if (!strcmp(dt, "F32")) memcpy(dst, src, (size_t)n * 4);
    else if (!strcmp(dt, "BF16")) dequant_row(QT_BF16, src, (int)n, dst);
    else dequant_row(QT_F16, src, (int)n, dst);
}

static int full_pread(int fd, void *buf, size_t n, off_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, off + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        done += (size_t)r;
    }
    return 0;
}

static int full_pwrite(int fd, const void *buf, size_t n, off_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pwrite(fd, (const char *)buf + done, n - done, off + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        done += (size_t)r;
    }
    return 0;
}

/* Keeps the last opened file of each side open: jobs come grouped by file. */
typedef struct { char path[4096]; int fd; } OpenFile;

static int open_cached(OpenFile *c, const char *path, int flags) {
    if (c->fd > 0 && strcmp(c->path, path) == 0) return c->fd;
    if (c->fd > 0) close(c->fd);
    snprintf(c->path, sizeof c->path, "%s", path);
    c->fd = open(path, flags);
    return c->fd;
}

int convert_jobs_main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: colibri convert-jobs JOBFILE\n"); return 2; }
    FILE *jf = fopen(argv[2], "r");
    if (!jf) { fprintf(stderr, "convert-jobs: cannot open %s\n", argv[2]); return 2; }
    OpenFile src = {{0}, -1}, dst = {{0}, -1};
    char line[16384];
    long total = 0, done = 0;
    while (fgets(line, sizeof line, jf)) total++;
    rewind(jf);
    double last = 0;
    int rc = 0;
    float *rowf = NULL;
    unsigned char *in = NULL, *out = NULL;
    while (fgets(line, sizeof line, jf)) {
        char sp[4096], dt[16], dp[4096], qn[16];
        long long soff, rows, cols, doff;
        if (sscanf(line, "%4095[^\t]\t%lld\t%15[^\t]\t%lld\t%lld\t%4095[^\t]\t%lld\t%15s", sp, &soff, dt, &rows, &cols, dp,
                   &doff, qn) != 8 || rows < 1 || cols < 1 || cols > (1 << 30)) {
            fprintf(stderr, "convert-jobs: malformed job line %ld\n", done + 1);
            rc = 2;
            break;
        }
        QType qt;
        int es = src_elem(dt), gt = gguf_type_from_name(dt); /* GGUF_* sources: whole blocks per row */
        size_t in_row = gt >= 0 ? gguf_row_bytes(gt, cols) : (size_t)cols * (size_t)es;
        if (gt >= 0 && !in_row) {
            fprintf(stderr, "convert-jobs: a row of %lld elements is not a whole number of %s blocks\n", cols, dt);
            rc = 2;
            break;
        }
        if (!in_row || qtype_from_name(qn, &qt)) { fprintf(stderr, "convert-jobs: unsupported dtype %s or qtype %s\n", dt, qn); rc = 2; break; }
        int sfd = open_cached(&src, sp, O_RDONLY), dfd = open_cached(&dst, dp, O_WRONLY);
        if (sfd < 0 || dfd < 0) { fprintf(stderr, "convert-jobs: cannot open %s\n", sfd < 0 ? sp : dp); rc = 2; break; }
        size_t out_row = qtype_row_bytes(qt, (int)cols);
        long long per = (long long)(CHUNK_BYTES / (in_row + out_row));
        if (per < 1) per = 1;
        free(rowf); free(in); free(out);
        size_t padded = ((size_t)cols + 31) / 32 * 32;
        rowf = malloc(padded * sizeof(float) * (size_t)(per < rows ? per : rows));
        in = malloc(in_row * (size_t)(per < rows ? per : rows));
        out = malloc(out_row * (size_t)(per < rows ? per : rows));
        if (!rowf || !in || !out) { fprintf(stderr, "convert-jobs: out of memory\n"); rc = 2; break; }
        for (long long r = 0; r < rows && !rc; r += per) {
            long long n = rows - r < per ? rows - r : per;
            if (full_pread(sfd, in, in_row * (size_t)n, (off_t)(soff + r * (long long)in_row))) {
                fprintf(stderr, "convert-jobs: short read from %s; the source file is truncated\n", sp);
                rc = 2;
                break;
            }
#pragma omp parallel for schedule(static) if (n > 1) /* one-row jobs: no thread team */
            for (long long i = 0; i < n; i++) {
                float *f = rowf + (size_t)i * padded;
                const unsigned char *ir = in + (size_t)i * in_row;
                unsigned char *orow = out + (size_t)i * out_row;
                if (gt >= 0) {
                    if (gguf_keep_row(gt, ir, cols, qt, orow)) continue; /* kept without float re-quantization */
                    gguf_dequant_row(gt, ir, cols, f);
                } else {
                    to_f32(dt, ir, cols, f);
                }
                quantize_row(qt, f, (int)cols, orow);
            }
            if (full_pwrite(dfd, out, out_row * (size_t)n, (off_t)(doff + r * (long long)out_row))) {
                fprintf(stderr, "convert-jobs: write to %s failed: %s\n", dp, strerror(errno));
                rc = 2;
            }
        }
        if (rc) break;
        done++;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = ts.tv_sec + ts.tv_nsec / 1e9;
        if (t - last > 0.5 || done == total) { fprintf(stderr, "PROGRESS %ld %ld\n", done, total); last = t; }
    }
    if (!rc && dst.fd > 0 && fsync(dst.fd)) { fprintf(stderr, "convert-jobs: fsync failed\n"); rc = 2; }
    free(rowf); free(in); free(out);
    if (src.fd > 0) close(src.fd);
    if (dst.fd > 0) close(dst.fd);
    fclose(jf);
    return rc;
}
