/* The byte-moving half of `coli convert`: the Python side plans every tensor and writes the
 * headers; this executes "read rows of a source tensor, re-encode, write at an offset" jobs
 * with bounded memory (one chunk of rows at a time). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "io/convert_gather.h"
#include "kernels/gguf_quants.h"
#include "kernels/lowbit.h"
#include "kernels/lowbit_quantize.h"
#include "kernels/quant.h"

#define CHUNK_BYTES (32u << 20)

static int src_elem(const char *dt) {
    if (!strcmp(dt, "F32")) return 4;
    if (!strcmp(dt, "F16") || !strcmp(dt, "BF16")) return 2;
    if (!strcmp(dt, "F8_E4M3") || !strcmp(dt, "F8_E8M0")) return 1;
    if (!strcmp(dt, "I64")) return 8; /* integer tables (DeepSeek-V4's tid2eid), stored as f32 */
    if (!strcmp(dt, "I32")) return 4;
    return 0;
}

/* float8_e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, 0x7f is NaN. */
static float e4m3(unsigned char b) {
    int e = (b >> 3) & 15, m = b & 7;
    float v = (e == 15 && m == 7) ? NAN : e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m / 8.0f, -6);
    return b & 0x80 ? -v : v;
}

static void to_f32(const char *dt, const unsigned char *src, long long n, float *dst) {
    if (!strcmp(dt, "F32")) memcpy(dst, src, (size_t)n * 4);
    else if (!strcmp(dt, "BF16")) dequant_row(QT_BF16, src, (int)n, dst);
    else if (!strcmp(dt, "F8_E4M3"))
        for (long long i = 0; i < n; i++) dst[i] = e4m3(src[i]);
    else if (!strcmp(dt, "F8_E8M0")) /* power-of-two block scales (DeepSeek-V4 releases); 0xff is NaN */
        for (long long i = 0; i < n; i++) dst[i] = src[i] == 0xff ? NAN : ldexpf(1.0f, (int)src[i] - 127);
    else if (!strcmp(dt, "I64"))
        for (long long i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, src + 8 * i, 8);
            dst[i] = (float)v;
        }
    else if (!strcmp(dt, "I32"))
        for (long long i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, src + 4 * i, 4);
            dst[i] = (float)v;
        }
    else dequant_row(QT_F16, src, (int)n, dst);
}

typedef struct {
    char path[4096];
    int fd;
} OpenFile;

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

static int open_cached(OpenFile *c, const char *path, int flags) {
    if (c->fd > 0 && strcmp(c->path, path) == 0) return c->fd;
    if (c->fd > 0) close(c->fd);
    snprintf(c->path, sizeof c->path, "%s", path);
    c->fd = open(path, flags);
    return c->fd;
}

/* Block-FP8 sources (DeepSeek/GLM releases): weight = fp8 * weight_scale_inv[r / br][c / bc]. The
 * job names the scale tensor (file, offset, dtype) and where the job's rows start in the weight. */
typedef struct {
    long long br, bc, row0, srow0, scols;
    float *s; /* the scale rows covering the job */
} BlockScale;

static int load_scale(const char *line, long long rows, long long cols, BlockScale *bs, OpenFile *f) {
    char sp[4096], sdt[16];
    long long soff;
    const char *p = line;
    for (int tabs = 0; tabs < 8 && p; tabs++) p = strchr(p + (tabs > 0), '\t');
    if (!p || sscanf(p, "\t%4095[^\t]\t%lld\t%15[^\t]\t%lld\t%lld\t%lld", sp, &soff, sdt, &bs->br, &bs->bc, &bs->row0) != 6 ||
        bs->br < 1 || bs->bc < 1 || bs->row0 < 0 || (strcmp(sdt, "F32") && strcmp(sdt, "BF16") && strcmp(sdt, "F8_E8M0")))
        return -1;
    bs->scols = (cols + bs->bc - 1) / bs->bc;
    bs->srow0 = bs->row0 / bs->br;
    long long n = (bs->row0 + rows - 1) / bs->br - bs->srow0 + 1, es = src_elem(sdt);
    unsigned char *raw = malloc((size_t)(n * bs->scols * es));
    bs->s = malloc(sizeof(float) * (size_t)(n * bs->scols));
    int fd = open_cached(f, sp, O_RDONLY), rc = -1;
    if (raw && bs->s && fd >= 0 &&
        !full_pread(fd, raw, (size_t)(n * bs->scols * es), (off_t)(soff + bs->srow0 * bs->scols * es))) {
        to_f32(sdt, raw, n * bs->scols, bs->s);
        rc = 0;
    }
    free(raw);
    return rc;
}

/* Calibrated jobs end in "\timportance\tPATH\tOFFSET": cols f32 weights at OFFSET of PATH, one per
 * input column (lowbit_quantize.h says how they weigh each block's error). */
static int load_importance(const char *line, long long cols, float **out, OpenFile *f) {
    char path[4096];
    long long off;
    const char *p = strstr(line, "\timportance\t");
    if (!p || sscanf(p, "\timportance\t%4095[^\t]\t%lld", path, &off) != 2 || off < 0) return -1;
    *out = malloc(sizeof(float) * (size_t)cols);
    int fd = open_cached(f, path, O_RDONLY);
    return *out && fd >= 0 && !full_pread(fd, *out, sizeof(float) * (size_t)cols, (off_t)off) ? 0 : -1;
}

/* The job's importance weights into *imp (NULL when it names none), replacing the last job's;
 * -1 with the reason on stderr when it names some that cannot be read. */
static int job_importance(const char *line, long job, long long cols, float **imp, OpenFile *f) {
    free(*imp);
    *imp = NULL;
    if (!strstr(line, "\timportance\t") || !load_importance(line, cols, imp, f)) return 0;
    fprintf(stderr, "convert-jobs: job line %ld: cannot read its %lld importance weights\n", job, cols);
    return -1;
}

/* A PROGRESS line for the launcher at most every half second, and at the last job. */
static void progress(long done, long total, double *last) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = ts.tv_sec + ts.tv_nsec / 1e9;
    if (t - *last > 0.5 || done == total) {
        fprintf(stderr, "PROGRESS %ld %ld\n", done, total);
        *last = t;
    }
}

int convert_jobs_main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: colibri convert-jobs JOBFILE\n");
        return 2;
    }
    FILE *jf = fopen(argv[2], "r");
    if (!jf) {
        fprintf(stderr, "convert-jobs: cannot open %s\n", argv[2]);
        return 2;
    }
    OpenFile src = {{0}, -1}, dst = {{0}, -1}, sc = {{0}, -1}, imf = {{0}, -1};
    float *imp = NULL; /* the job's per-column importance weights (calibration), or NULL */
    BlockScale bs = {0};
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
        if (sscanf(line, "%4095[^\t]\t%lld\t%15[^\t]\t%lld\t%lld\t%4095[^\t]\t%lld\t%15s", sp, &soff, dt, &rows, &cols, dp, &doff,
                   qn) != 8 ||
            rows < 1 || cols < 1 || cols > (1 << 30)) {
            fprintf(stderr, "convert-jobs: malformed job line %ld\n", done + 1);
            rc = 2;
            break;
        }
        QType qt;
        const char *gf = gather_fields(line);
        if (gf) { /* strided or MXFP4 sources: convert_gather.c */
            int dfd = qtype_from_name(qn, &qt) ? -1 : open_cached(&dst, dp, O_WRONLY);
            if (dfd >= 0 && job_importance(line, done + 1, cols, &imp, &imf)) {
                rc = 2;
                break;
            }
            if (dfd < 0 || gather_job(gf, sp, soff, dt, rows, cols, dfd, doff, qt, imp)) {
                if (dfd < 0) fprintf(stderr, "convert-jobs: unsupported qtype %s or cannot open %s\n", qn, dp);
                rc = 2;
                break;
            }
            progress(++done, total, &last);
            continue;
        }
        int es = src_elem(dt), gt = gguf_type_from_name(dt); /* GGUF_* sources: whole blocks per row */
        size_t in_row = gt >= 0 ? gguf_row_bytes(gt, cols) : (size_t)cols * (size_t)es;
        if (gt >= 0 && !in_row) {
            fprintf(stderr, "convert-jobs: a row of %lld elements is not a whole number of %s blocks\n", cols, dt);
            rc = 2;
            break;
        }
        if (!in_row || qtype_from_name(qn, &qt)) {
            fprintf(stderr, "convert-jobs: unsupported dtype %s or qtype %s\n", dt, qn);
            rc = 2;
            break;
        }
        if (!qtype_writable(qt) && gguf_lowbit_qtype(gt) != qt) { /* the lattice i-quants are kept, never written */
            fprintf(
                stderr,
                "convert-jobs: job line %ld: %s storage is kept from GGUF blocks of that type only; it is not written from %s\n",
                done + 1, qn, dt);
            rc = 2;
            break;
        }
        if (!qtype_row_bytes(qt, (int)cols)) {
            fprintf(stderr, "convert-jobs: job line %ld: a row of %lld elements is not a whole number of %s blocks\n", done + 1,
                    cols, qn);
            rc = 2;
            break;
        }
        if (job_importance(line, done + 1, cols, &imp, &imf)) {
            rc = 2;
            break;
        }
        free(bs.s);
        bs.s = NULL;
        if (!strcmp(dt, "F8_E4M3") && load_scale(line, rows, cols, &bs, &sc)) {
            fprintf(stderr, "convert-jobs: job line %ld: an F8_E4M3 source needs a readable weight_scale_inv block scale\n",
                    done + 1);
            rc = 2;
            break;
        }
        int sfd = open_cached(&src, sp, O_RDONLY), dfd = open_cached(&dst, dp, O_WRONLY);
        if (sfd < 0 || dfd < 0) {
            fprintf(stderr, "convert-jobs: cannot open %s\n", sfd < 0 ? sp : dp);
            rc = 2;
            break;
        }
        size_t out_row = qtype_row_bytes(qt, (int)cols);
        long long per = (long long)(CHUNK_BYTES / (in_row + out_row));
        if (per < 1) per = 1;
        free(rowf);
        free(in);
        free(out);
        size_t padded = ((size_t)cols + 31) / 32 * 32;
        rowf = malloc(padded * sizeof(float) * (size_t)(per < rows ? per : rows));
        in = malloc(in_row * (size_t)(per < rows ? per : rows));
        out = malloc(out_row * (size_t)(per < rows ? per : rows));
        if (!rowf || !in || !out) {
            fprintf(stderr, "convert-jobs: out of memory\n");
            rc = 2;
            break;
        }
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
                if (bs.s) { /* block-FP8: the f32 product is the exact value rounded once, as the reference computes it */
                    const float *srow = bs.s + ((bs.row0 + r + i) / bs.br - bs.srow0) * bs.scols;
                    for (long long c = 0; c < cols; c++) f[c] *= srow[c / bs.bc];
                }
                quantize_row_weighted(qt, f, imp, (int)cols, orow);
            }
            if (full_pwrite(dfd, out, out_row * (size_t)n, (off_t)(doff + r * (long long)out_row))) {
                fprintf(stderr, "convert-jobs: write to %s failed: %s\n", dp, strerror(errno));
                rc = 2;
            }
        }
        if (rc) break;
        progress(++done, total, &last);
    }
    if (!rc && dst.fd > 0 && fsync(dst.fd)) {
        fprintf(stderr, "convert-jobs: fsync failed\n");
        rc = 2;
    }
    free(rowf);
    free(in);
    free(out);
    free(bs.s);
    free(imp);
    if (imf.fd > 0) close(imf.fd);
    if (sc.fd > 0) close(sc.fd);
    if (src.fd > 0) close(src.fd);
    if (dst.fd > 0) close(dst.fd);
    fclose(jf);
    return rc;
}
