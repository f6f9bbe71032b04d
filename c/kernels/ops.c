#include "kernels/ops.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/act_stats.h"
#include "kernels/lowbit.h"
#include "util/fwd_alloc.h"
#include "util/op_prof.h"

#define ROW_TILE 8

/* Smallest matmul, in block dots, worth a parallel region. Starting a region costs ~2 us when
 * idle threads spin but ~60 us when they sleep (OMP_WAIT_POLICY=PASSIVE on a 2-core VM), while
 * n threads save (1 - 1/n) of the serial time at ~3 ns per block dot; with sleeping threads a
 * small model's decode matmuls are faster on one thread. Measured once, as the fastest of a few
 * tiny regions (a hiccup cannot inflate it); only speed depends on it, never results. */
#define BLOCK_DOT_S 3e-9
static double par_min_blocks(void) {
    static double min_blocks = -1;
    if (omp_in_parallel()) return 0; /* a nested region runs on this thread anyway (moe_exec.c) */
    if (min_blocks < 0) {
        int n = omp_get_max_threads(), hits = 0;
        double fork = 1e9;
        for (int i = 0; i < 6; i++) { /* the first also creates the team; each thread must run */
            double t = omp_get_wtime();
#pragma omp parallel for schedule(static)
            for (int k = 0; k < n; k++) {
#pragma omp atomic
                hits++;
            }
            if (i) fork = fmin(fork, omp_get_wtime() - t);
        }
        min_blocks = n > 1 ? fork / BLOCK_DOT_S * n / (n - 1) : 0;
    }
    return min_blocks;
}

int par_worth(double block_dots) { return block_dots >= par_min_blocks(); }

int par_threads(void) { return omp_get_max_threads(); }

/* The decode profile's view of a matmul (util/op_prof.h): its weight bytes, and, on the thread
 * that runs the pass, its time, attention's projections apart from the attention over the KV
 * around them. Inside a parallel region (experts, one per thread) only the bytes count: the
 * time is the region's. */
static ProfOp mm_prof_enter(size_t bytes, int *timed) {
    *timed = 0;
    if (!prof_active) return PROF_LOOP;
    const ProfOp prev = prof_current();
    *timed = !omp_in_parallel();
    if (*timed && prev == PROF_ATTN_KV) prof_switch(PROF_ATTN_PROJ);
    prof_bytes(bytes);
    return prev;
}

static void mm_prof_leave(ProfOp prev, int timed) {
    if (timed && prof_current() != prev) prof_switch(prev);
}

/* What a parallel region's threads did not spend computing (its start, uneven shares, the
 * join): the region's wall time less the threads' mean busy time, moved to PROF_SYNC. */
static void mm_prof_sync(double t0, double busy, int nth) {
    const double idle = (omp_get_wtime() - t0) - busy / (nth > 0 ? nth : 1);
    if (idle > 0) prof_move_ms(prof_current(), PROF_SYNC, idle * 1e3);
}

/* One thread's share of a group of matrices on the same quantized activations. Each matrix runs
 * as matmul alone would run it: its set's qgemm over whole 16-row tiles and every position where
 * the set has one, else the qdot over 8-row tiles, qdot_pass_rows(type) positions at a time (both
 * weights and activations stay in L1 and each unpacked weight block serves several positions).
 * The group's tiles are split by weight bytes, contiguously: thread id takes the tiles that start
 * in [lo, hi) of the bytes of all the matrices laid end to end. Only the split changes with the
 * thread count, never a row's bits. */
static void group_share(int n, float *const *ys, const QMat *const *ws, const float *const *biases, const QAct *a,
                        const int8_t *packed, uint64_t lo, uint64_t hi) {
    const int T = a->rows;
    uint64_t base = 0;
    for (int i = 0; i < n; i++) {
        const QMat *w = ws[i];
        const int tile = kern.qgemm[w->qt] ? 16 : ROW_TILE, tiles = (w->rows + tile - 1) / tile;
        const uint64_t tile_bytes = (uint64_t)tile * w->row_bytes;
        const uint64_t u0 = lo <= base ? 0 : (lo - base + tile_bytes - 1) / tile_bytes;
        const uint64_t u1 = hi <= base ? 0 : (hi - base + tile_bytes - 1) / tile_bytes;
        base += (uint64_t)w->rows * w->row_bytes;
        const int r0 = (int)(u0 < (uint64_t)tiles ? u0 : (uint64_t)tiles) * tile;
        const int r1e = (int)(u1 < (uint64_t)tiles ? u1 : (uint64_t)tiles) * tile, r1 = r1e < w->rows ? r1e : w->rows;
        if (r1 <= r0) continue;
        const int rows = w->rows;
        float *y = ys[i];
        if (kern.qgemm[w->qt])
            kern.qgemm[w->qt](w->data + (size_t)r0 * w->row_bytes, w->row_bytes, r1 - r0, a, packed, y + r0, (size_t)rows);
        else
            for (int t0 = r0; t0 < r1; t0 += ROW_TILE) {
                const int t1 = t0 + ROW_TILE < r1 ? t0 + ROW_TILE : r1, step = qdot_pass_rows(w->qt);
                for (int p0 = 0; p0 < T; p0 += step) {
                    const int nt = T - p0 < step ? T - p0 : step;
                    kern.qdot[w->qt](w->data + (size_t)t0 * w->row_bytes, w->row_bytes, t1 - t0, a, p0, nt,
                                     y + (size_t)p0 * rows + t0, (size_t)rows);
                }
            }
        if (biases[i])
            for (int t = 0; t < T; t++)
                for (int r = r0; r < r1; r++) y[(size_t)t * rows + r] += biases[i][r];
    }
}

/* q8/q4/q6/low-bit matrices on one input: each activation row quantized to int16 blocks once (and
 * packed once for the sets with a qgemm), then one parallel region over all the matrices' row
 * tiles, instead of a quantization and a fork and join per matrix. All matrices have x's width. */
static void matmul_quant_group(int n, float *const *ys, const float *x, int T, const QMat *const *ws,
                               const float *const *biases) {
    const int cols = ws[0]->cols, nb = (cols + QBLOCK - 1) / QBLOCK;
    const size_t nblk = (size_t)T * nb, qfloats = nblk * QBLOCK / 2; /* int16 blocks, in floats */
    int gemm = 0, lowbit = 0;
    uint64_t bytes = 0;
    double rows_all = 0;
    for (int i = 0; i < n; i++) {
        gemm |= kern.qgemm[ws[i]->qt] != NULL;
        const LowbitType *lt = lowbit_type(ws[i]->qt);
        lowbit |= kern.lowbit_pack && lt && lt->block == 256 && nb % 8 == 0;
        bytes += (uint64_t)ws[i]->rows * ws[i]->row_bytes;
        rows_all += ws[i]->rows;
    }
    const size_t pfloats = gemm ? (kern.pack_bytes(T, nb) + 3) / 4 : 0;
    const size_t lfloats = lowbit ? (lowbit_pack_bytes(T, nb) + 3) / 4 : 0;
    float *buf = scratch(2, qfloats + 2 * nblk + pfloats + lfloats);
    if (!buf) return;
    unsigned char *lp = lowbit ? (unsigned char *)(buf + qfloats + 2 * nblk + pfloats) : NULL;
    const QAct a = {nb, T, (int16_t *)buf, buf + qfloats, buf + qfloats + nblk, lp};
    int8_t *packed = gemm ? (int8_t *)(buf + qfloats + 2 * nblk) : NULL;
    int timed;
    const ProfOp prev = mm_prof_enter((size_t)bytes, &timed);
    double busy = 0;
    int team = 1;
    /* Serial: quantizing is ~1% of the dots, far less than the extra barrier (a futex round
     * trip with passive waiting) that a parallel loop here would add to every decode matmul. */
    for (int t = 0; t < T; t++) kern.quantize_act(x + (size_t)t * cols, cols, &a, t);
    if (packed) kern.pack_act(&a, packed);
    if (lp) lowbit_pack_act(&a, lp);
    const double t0 = timed ? omp_get_wtime() : 0;
#pragma omp parallel if (rows_all * (double)nblk >= par_min_blocks())
    {
        const double tb = timed ? omp_get_wtime() : 0;
        const uint64_t nth = (uint64_t)omp_get_num_threads(), id = (uint64_t)omp_get_thread_num();
        group_share(n, ys, ws, biases, &a, packed, bytes * id / nth, id + 1 == nth ? bytes : bytes * (id + 1) / nth);
        if (timed) {
#pragma omp atomic
            busy += omp_get_wtime() - tb;
#pragma omp single nowait
            team = omp_get_num_threads();
        }
    }
    if (timed) mm_prof_sync(t0, busy, team);
    mm_prof_leave(prev, timed);
}

void matmul(float *y, const float *x, int T, const QMat *w, const float *bias) {
    if (act_stats_on) act_stats_observe(w, x, T);
    if (kern.qdot[w->qt]) {
        matmul_quant_group(1, (float *const[]){y}, x, T, (const QMat *const[]){w}, (const float *const[]){bias});
        return;
    }
    const int rows = w->rows, cols = w->cols;
    const size_t padded = ((size_t)cols + 31) / 32 * 32;
    const int tiles = (rows + ROW_TILE - 1) / ROW_TILE;
    int timed;
    const ProfOp prev = mm_prof_enter((size_t)rows * w->row_bytes, &timed);
#pragma omp parallel for schedule(static)
    for (int tile = 0; tile < tiles; tile++) {
        float *buf = scratch(0, padded * ROW_TILE);
        if (!buf) continue;
        int r0 = tile * ROW_TILE, nr = rows - r0 < ROW_TILE ? rows - r0 : ROW_TILE;
        for (int i = 0; i < nr; i++) kern.dequant_row(w->qt, w->data + (size_t)(r0 + i) * w->row_bytes, cols, buf + i * padded);
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * cols;
            float *yt = y + (size_t)t * rows + r0;
            for (int i = 0; i < nr; i++) yt[i] = kern.dot(buf + i * padded, xt, cols) + (bias ? bias[r0 + i] : 0.0f);
        }
    }
    mm_prof_leave(prev, timed);
}

/* Matrices that share x and a kernel path run as one group (matmul_quant_group); the float
 * types, or widths that differ, run one matmul each. */
static int fusable(int n, const QMat *const *ws) {
    for (int i = 0; i < n; i++)
        if (!kern.qdot[ws[i]->qt] || ws[i]->cols != ws[0]->cols) return 0;
    return 1;
}

void matmul_fused(int n, float *const *ys, const float *x, int T, const QMat *const *ws, const float *const *biases) {
    if (n < 1 || n > MATMUL_FUSE_MAX || !fusable(n, ws)) {
        for (int i = 0; i < n; i++) matmul(ys[i], x, T, ws[i], biases[i]);
        return;
    }
    for (int i = 0; act_stats_on && i < n; i++) act_stats_observe(ws[i], x, T);
    matmul_quant_group(n, ys, x, T, ws, biases);
}

void matmul_f32(float *y, const float *x, int T, const float *w, int rows, int cols) {
    prof_bytes((size_t)rows * cols * sizeof(float));
#pragma omp parallel for collapse(2) schedule(static) if (par_worth((double)T * rows * cols / QBLOCK))
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) y[(size_t)t * rows + r] = kern.dot(w + (size_t)r * cols, x + (size_t)t * cols, cols);
}

void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float s = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * s);
}


void mlp_swiglu(const Mlp *p, const float *x, int T, int inter, float *out) {
    float *g = fwd_malloc(sizeof(float) * (size_t)T * inter), *u = fwd_malloc(sizeof(float) * (size_t)T * inter);
    if (!g || !u) {
        free(g);
        free(u);
        return;
    } /* fwd_oom() tells the caller */
    matmul_fused(2, (float *const[]){g, u}, x, T, (const QMat *const[]){&p->gate, &p->up},
                 (const float *const[]){p->gate_b, p->up_b});
    if (p->act == ACT_SWIGLU_CLAMP) {
        const float a = p->alpha, lim = p->limit;
        for (size_t i = 0; i < (size_t)T * inter; i++) {
            float x = g[i] < lim ? g[i] : lim, y = u[i] < -lim ? -lim : (u[i] > lim ? lim : u[i]);
            g[i] = (y + 1.0f) * (x / (1.0f + expf(-a * x)));
        }
    } else if (p->act == ACT_SILU_CLAMP) {
        const float lim = p->limit;
        for (size_t i = 0; i < (size_t)T * inter; i++) {
            float x = g[i] < lim ? g[i] : lim, y = u[i] < -lim ? -lim : (u[i] > lim ? lim : u[i]);
            g[i] = silu(x) * y;
        }
    } else
        for (size_t i = 0; i < (size_t)T * inter; i++) g[i] = silu(g[i]) * u[i];
    matmul(out, g, T, &p->down, p->down_b);
    free(g);
    free(u);
}
