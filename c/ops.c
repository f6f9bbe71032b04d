#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ROW_TILE 8
#define N_SCRATCH 4

static _Thread_local float *tl_buf[N_SCRATCH];
static _Thread_local size_t tl_cap[N_SCRATCH];

float *scratch(int slot, size_t n) {
    if (tl_cap[slot] < n) {
        free(tl_buf[slot]);
        tl_cap[slot] = n + 64;
        tl_buf[slot] = aligned_alloc(64, ((tl_cap[slot] * sizeof(float)) + 63) & ~(size_t)63);
        if (!tl_buf[slot]) abort(); /* scratch is small relative to the model; failing here is fatal */
    }
    return tl_buf[slot];
}

void matmul(float *y, const float *x, int T, const QMat *w, const float *bias) {
    const int rows = w->rows, cols = w->cols;
    const size_t padded = ((size_t)cols + 31) / 32 * 32;
    const int tiles = (rows + ROW_TILE - 1) / ROW_TILE;
#pragma omp parallel for schedule(static)
    for (int tile = 0; tile < tiles; tile++) {
        float *buf = scratch(0, padded * ROW_TILE);
        int r0 = tile * ROW_TILE, nr = rows - r0 < ROW_TILE ? rows - r0 : ROW_TILE;
        for (int i = 0; i < nr; i++) kern.dequant_row(w->qt, w->data + (size_t)(r0 + i) * w->row_bytes, cols, buf + i * padded);
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * cols;
            float *yt = y + (size_t)t * rows + r0;
            for (int i = 0; i < nr; i++) yt[i] = kern.dot(buf + i * padded, xt, cols) + (bias ? bias[r0 + i] : 0.0f);
        }
    }
}

void matmul_f32(float *y, const float *x, int T, const float *w, int rows, int cols) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) y[(size_t)t * rows + r] = kern.dot(w + (size_t)r * cols, x + (size_t)t * cols, cols);
}

void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float s = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * s);
}

void softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - mx); sum += x[i]; }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

float silu(float x) { return x / (1.0f + expf(-x)); }
