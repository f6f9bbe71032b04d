/* The selected routed experts of one MoE layer run in parallel across threads, each expert on
 * one thread: for decode and small batches, where each expert's matmuls are too small to split
 * well (a fork/join per matmul costs more than it saves). */
#ifndef COLI_MOE_EXEC_H
#define COLI_MOE_EXEC_H
#include "experts/expert_store.h"

/* Whether n_rows (positions x top_k) is few enough for the parallel path, on more than 1 thread,
 * and the layer's work (block_dots, 32-element dots over its rows) pays for a parallel region
 * (par_worth): tiny experts run faster on the calling thread than through a fork and join. */
int moe_parallel_ok(int n_rows, double block_dots);

/* out[T][H] += sum over (t, j < K) of wts[t*K+j] * expert sel[t*K+j](x_t), each selected expert
 * run once over all the positions that chose it (batch-union). The outputs are added in expert
 * order, then position order, as block_moe.c's serial loop adds them, and each expert's output
 * is the same bits on one thread as on many: the result equals the serial path's bit for bit.
 * Returns -1 (fwd_oom() set) when memory runs out. */
int moe_run_experts_parallel(const Mlp *experts, int E, int K, int width, int H, const int *sel, const float *wts, const float *x,
                             int T, float *out);

#endif
