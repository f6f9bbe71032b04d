/* The plain float helpers below every kernel family: per-thread scratch, softmax, SiLU. */
#include "kernels/vec.h"

#include <math.h>
#include <stdlib.h>

#include "util/fwd_alloc.h"

#define N_SCRATCH 5

static _Thread_local float *tl_buf[N_SCRATCH];
static _Thread_local size_t tl_cap[N_SCRATCH];

float *scratch(int slot, size_t n) {
    if (tl_cap[slot] < n) {
        free(tl_buf[slot]);
        tl_buf[slot] = fwd_aligned_alloc(64, (((n + 64) * sizeof(float)) + 63) & ~(size_t)63);
        tl_cap[slot] = tl_buf[slot] ? n + 64 : 0; /* NULL: the caller skips its work, fwd_oom() fails the pass */
    }
    return tl_buf[slot];
}

void softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

float silu(float x) { return x / (1.0f + expf(-x)); }
