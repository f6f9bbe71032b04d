/* Shared math ops every family is built from. */
#ifndef COLI_OPS_H
#define COLI_OPS_H
#include "kernels/kernels.h"
#include "kernels/vec.h"

/* y[T][rows] = x[T][cols] . W^T (+ bias); parallel over rows, several positions per weight pass. */
void matmul(float *y, const float *x, int T, const QMat *w, const float *bias);
/* matmul of n <= MATMUL_FUSE_MAX matrices on the same x (q/k/v, gate/up): the same bits as n
 * matmul calls, with one activation quantization and one parallel region where they allow. */
#define MATMUL_FUSE_MAX 4
void matmul_fused(int n, float *const *ys, const float *x, int T, const QMat *const *ws, const float *const *biases);
/* y[T][rows] = x[T][cols] . W^T for a plain f32 matrix (router). */
void matmul_f32(float *y, const float *x, int T, const float *w, int rows, int cols);
void rmsnorm(float *y, const float *x, const float *w, int n, float eps);
/* Whether a parallel region pays for work of this many 32-element dots (starting one costs
 * ~2 us with spinning threads, ~60 us with sleeping ones); only speed depends on it. */
int par_worth(double block_dots);
/* Threads a parallel region here runs on (for code built without OpenMP's header: the fuzzers). */
int par_threads(void);

typedef enum { ACT_SILU = 0, ACT_SWIGLU_CLAMP, ACT_SILU_CLAMP } MlpAct;

typedef struct {
    QMat gate, up, down;
    const float *gate_b, *up_b, *down_b;
    MlpAct act;
    float alpha, limit; /* ACT_SWIGLU_CLAMP */
} Mlp;

/* out[T][hidden] = down(act(gate(x), up(x))) for x[T][hidden]; inter is the MLP width.
 * ACT_SILU: silu(g) * u. ACT_SWIGLU_CLAMP (gpt-oss): g clamped above at limit, u to
 * [-limit, limit], then (u + 1) * g * sigmoid(alpha * g). ACT_SILU_CLAMP (DeepSeek-V4): the same
 * clamps, then silu(g) * u. out may be x: x is read only before out is written. */
void mlp_swiglu(const Mlp *p, const float *x, int T, int inter, float *out);

#endif
