/* The plain float helpers below every kernel family: per-thread scratch, softmax, SiLU. */
#include "kernels/vec.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "util/fwd_alloc.h"

#define N_SCRATCH 5

typedef struct {
    float *buf[N_SCRATCH];
    size_t cap[N_SCRATCH];
} Scratch;

static _Thread_local Scratch tl_scratch;

/* A thread that ends (OpenMP ends the surplus ones when a team shrinks, a caller's own pthread
 * returns) frees its buffers: the key's destructor runs while the thread's storage is still there. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_key_once = PTHREAD_ONCE_INIT;
static _Thread_local int tl_registered;

static void scratch_free(void *p) {
    Scratch *s = p;
    for (int i = 0; i < N_SCRATCH; i++) free(s->buf[i]);
    *s = (Scratch){0};
}

static void scratch_key_make(void) { pthread_key_create(&scratch_key, scratch_free); }

float *scratch(int slot, size_t n) {
    float **tl_buf = tl_scratch.buf;
    size_t *tl_cap = tl_scratch.cap;
    if (tl_cap[slot] < n) {
        if (!tl_registered) {
            pthread_once(&scratch_key_once, scratch_key_make);
            pthread_setspecific(scratch_key, &tl_scratch);
            tl_registered = 1;
        }
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
