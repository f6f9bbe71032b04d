#include "experts/moe_exec.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "util/fwd_alloc.h"
#include "util/op_prof.h"

/* Past this many rows each expert has enough for a split matmul. Below it, one expert per thread
 * beats splitting each expert's matmuls: a 128-position prefill chunk of a top-8 model (1024
 * rows, ~8 per expert) ran 1.03-1.33x faster so on two threads. The per-choice outputs it holds
 * at once are the ones the split path holds too (the runtime share counts them). */
#define PAR_EXPERT_ROWS 1024

int moe_parallel_ok(int n_rows, double block_dots) {
    return n_rows <= PAR_EXPERT_ROWS && omp_get_max_threads() > 1 && par_worth(block_dots);
}

int moe_run_experts_parallel(const Mlp *experts, int E, int K, int width, int H, const int *sel, const float *wts, const float *x,
                             int T, float *out) {
    const int n_rows = T * K;
    int *start = fwd_calloc((size_t)E + 1, sizeof(int)), *fill = fwd_malloc(sizeof(int) * (size_t)E);
    int *rows = fwd_malloc(sizeof(int) * (size_t)n_rows), *active = fwd_malloc(sizeof(int) * (size_t)E);
    float *yout = fwd_malloc(sizeof(float) * (size_t)n_rows * H);
    int rc = -1, n_active = 0;
    if (!start || !fill || !rows || !active || !yout) goto out;
    /* expert e's rows: rows[start[e] .. start[e+1]), in position order */
    for (int i = 0; i < n_rows; i++) start[sel[i] + 1]++;
    for (int e = 0; e < E; e++) {
        if (start[e + 1]) active[n_active++] = e;
        start[e + 1] += start[e];
    }
    memcpy(fill, start, sizeof(int) * (size_t)E);
    for (int i = 0; i < n_rows; i++) rows[fill[sel[i]]++] = i;
    /* Inside this region the matmuls' own parallel loops run on the calling thread alone
     * (nested regions are inactive). Each expert's input rows are gathered into its output
     * rows: mlp_swiglu reads its input only before it writes its output. */
    /* The profile (util/op_prof.h) counts what the threads did not spend on experts as sync. */
    const int timed = prof_active && !omp_in_parallel();
    const double t0 = timed ? omp_get_wtime() : 0;
    double busy = 0;
    int nth = 1;
#pragma omp parallel
    {
        const double tb = timed ? omp_get_wtime() : 0;
#pragma omp for schedule(dynamic, 1) nowait
        for (int a = 0; a < n_active; a++) {
            const int e = active[a], s = start[e];
            float *io = yout + (size_t)s * H;
            for (int i = s; i < start[e + 1]; i++) memcpy(yout + (size_t)i * H, x + (size_t)(rows[i] / K) * H, sizeof(float) * H);
            mlp_swiglu(&experts[e], io, start[e + 1] - s, width, io);
        }
        if (timed) {
#pragma omp atomic
            busy += omp_get_wtime() - tb;
#pragma omp single nowait
            nth = omp_get_num_threads();
        }
    }
    if (timed) {
        const double idle = (omp_get_wtime() - t0) - busy / nth;
        if (idle > 0) prof_move_ms(prof_current(), PROF_SYNC, idle * 1e3);
    }
    if (fwd_oom()) goto out;
    for (int i = 0; i < n_rows; i++) {
        float *o = out + (size_t)(rows[i] / K) * H;
        const float w = wts[rows[i]], *yi = yout + (size_t)i * H;
        for (int d = 0; d < H; d++) o[d] += w * yi[d];
    }
    rc = 0;
out:
    free(start);
    free(fill);
    free(rows);
    free(active);
    free(yout);
    return rc;
}
