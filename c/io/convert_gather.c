#include "io/convert_gather.h"

#include "kernels/lowbit_quantize.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *gather_fields(const char *line) {
    const char *p = line;
    for (int tabs = 0; tabs < 8 && p; tabs++) p = strchr(p + (tabs > 0), '\t');
    if (!p) return NULL;
    return !strncmp(p, "\tgather\t", 8) || !strncmp(p, "\tmxfp4\t", 7) ? p : NULL;
}

/* e2m1: sign, 2 exponent bits, 1 mantissa bit (the OCP MX table). */
static const float E2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

void mxfp4_dequant_row(const unsigned char *blocks, const unsigned char *scales, long long n, float *dst) {
    for (long long g = 0; g < n / 32; g++) {
        const int e = (int)scales[g] - 127; /* exact: every product is a small power-of-two multiple */
        for (int j = 0; j < 16; j++) {
            unsigned char b = blocks[g * 16 + j];
            dst[g * 32 + 2 * j] = ldexpf(E2M1[b & 15], e);
            dst[g * 32 + 2 * j + 1] = ldexpf(E2M1[b >> 4], e);
        }
    }
}

static int read_span(const char *path, long long off, size_t n, unsigned char **out) {
    int fd = open(path, O_RDONLY);
    *out = malloc(n ? n : 1);
    size_t done = 0;
    while (fd >= 0 && *out && done < n) {
        ssize_t r = pread(fd, *out + done, n - done, (off_t)(off + (long long)done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        done += (size_t)r;
    }
    if (fd >= 0) close(fd);
    if (done == n && *out) return 0;
    fprintf(stderr, "convert-jobs: cannot read %zu bytes at %lld of %s; the source file is truncated or unreadable\n", n, off,
            path);
    free(*out);
    *out = NULL;
    return -1;
}

static float elem(const char *dt, const unsigned char *p) {
    if (!strcmp(dt, "F32")) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return !strcmp(dt, "BF16") ? bf16_to_f32(h) : f16_to_f32(h);
}

int gather_job(const char *fields, const char *src, long long soff, const char *dt, long long rows, long long cols, int dfd,
               long long doff, QType qt, const float *imp) {
    const size_t out_row = qtype_row_bytes(qt, (int)cols), padded = ((size_t)cols + 31) / 32 * 32;
    if (!qtype_writable(qt) || !out_row) {
        fprintf(stderr, "convert-jobs: %s rows of %lld elements cannot be written from floats\n", qtype_name(qt), cols);
        return -1;
    }
    unsigned char *in = NULL, *sc = NULL, *out = malloc(out_row * (size_t)rows);
    float *f = calloc(padded * (size_t)rows, sizeof(float));
    int rc = -1;
    if (!out || !f) {
        fprintf(stderr, "convert-jobs: out of memory\n");
        goto done;
    }
    if (!strncmp(fields, "\tgather\t", 8)) { /* element (r, c) at soff + (r*rs + c*cs) elements */
        long long rs, cs;
        int es = !strcmp(dt, "F32") ? 4 : (!strcmp(dt, "BF16") || !strcmp(dt, "F16")) ? 2 : 0;
        if (sscanf(fields + 8, "%lld\t%lld", &rs, &cs) != 2 || rs < 0 || cs < 1 || !es) {
            fprintf(stderr, "convert-jobs: malformed gather job (%s source)\n", dt);
            goto done;
        }
        long long span = (rows - 1) * rs + (cols - 1) * cs + 1;
        if (read_span(src, soff, (size_t)span * (size_t)es, &in)) goto done;
        for (long long r = 0; r < rows; r++)
            for (long long c = 0; c < cols; c++) f[(size_t)r * padded + c] = elem(dt, in + (size_t)(r * rs + c * cs) * es);
    } else { /* mxfp4: scales file, its offset for row 0, source rows per output row */
        char sp[4096];
        long long s_off, step;
        if (strcmp(dt, "MXFP4") || sscanf(fields + 7, "%4095[^\t]\t%lld\t%lld", sp, &s_off, &step) != 3 || step < 1 ||
            cols % 32) {
            fprintf(stderr, "convert-jobs: malformed MXFP4 job (rows of %lld values need whole 32-value blocks)\n", cols);
            goto done;
        }
        const size_t brow = (size_t)cols / 2, srow = (size_t)cols / 32, span = (size_t)((rows - 1) * step + 1);
        if (read_span(src, soff, span * brow, &in) || read_span(sp, s_off, span * srow, &sc)) goto done;
        for (long long r = 0; r < rows; r++) {
            const unsigned char *br = in + (size_t)(r * step) * brow, *sr = sc + (size_t)(r * step) * srow;
            if (qt == QT_MXFP4) mxfp4_from_release(br, sr, (int)cols, out + (size_t)r * out_row); /* kept as shipped */
            else mxfp4_dequant_row(br, sr, cols, f + (size_t)r * padded);
        }
    }
    if (strncmp(fields, "\tmxfp4\t", 7) || qt != QT_MXFP4)
        for (long long r = 0; r < rows; r++)
            quantize_row_weighted(qt, f + (size_t)r * padded, imp, (int)cols, out + (size_t)r * out_row);
    size_t n = out_row * (size_t)rows, done_b = 0;
    while (done_b < n) {
        ssize_t w = pwrite(dfd, out + done_b, n - done_b, (off_t)(doff + (long long)done_b));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            fprintf(stderr, "convert-jobs: write failed: %s\n", strerror(errno));
            goto done;
        }
        done_b += (size_t)w;
    }
    rc = 0;
done:
    free(in);
    free(sc);
    free(out);
    free(f);
    return rc;
}
