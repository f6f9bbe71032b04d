/* The per-op decode profile (--profile): where a decode step's time goes, op by op, and the
 * weight bytes each op read, so that achieved bandwidth shows per op on any machine.
 *
 * Time is charged exclusively: one op is current at a time, and switching charges the time
 * since the last switch to the op left, so the ops of a step always sum to the step's time.
 * Only the decode steps of the protocol loop are profiled (prof_step_begin/end); with the flag
 * off, or outside a step, every hook returns at once and nothing else changes. The hooks that
 * switch ops run on the thread that runs the forward pass; bytes may come from any thread. */
#ifndef COLI_OP_PROF_H
#define COLI_OP_PROF_H
#include <stddef.h>
#include <stdint.h>

typedef enum {
    PROF_LOOP = 0,  /* the protocol loop around the pass: frames out, request bookkeeping */
    PROF_NORM,      /* embedding row, norms, residual adds: the glue between blocks */
    PROF_ATTN_PROJ, /* attention's weight matmuls (q/k/v, gates, output) */
    PROF_ATTN_KV,   /* attention over the KV cache (or a recurrent state), rope, head norms */
    PROF_ROUTER,    /* MoE routers */
    PROF_EXPERTS,   /* routed experts (I/O waits of streamed ones included) */
    PROF_MLP,       /* dense and shared MLPs */
    PROF_HEAD,      /* final norm and output head */
    PROF_SAMPLER,   /* penalties, grammar and sampling of the next token */
    PROF_SYNC,      /* inside parallel matmuls, the time threads did not compute: region start,
                     * uneven shares, the join (taken out of the op that ran the matmul) */
    PROF_COUNT
} ProfOp;

typedef struct {
    double ms[PROF_COUNT];
    uint64_t bytes[PROF_COUNT]; /* weight bytes read */
    uint64_t steps;             /* decode forward passes */
} ProfStats;

extern int prof_enabled; /* --profile */
extern int prof_active;  /* inside a profiled decode step */

const char *prof_op_name(ProfOp op);
ProfOp prof_switch(ProfOp op); /* makes op current; returns the op it replaced */
void prof_add_bytes_to(ProfOp op, uint64_t bytes);
void prof_move_ms(ProfOp from, ProfOp to, double ms);
ProfOp prof_current(void);

/* Make op current for a span of code; prof_leave(prev) restores the op before it. */
static inline ProfOp prof_enter(ProfOp op) { return prof_active ? prof_switch(op) : op; }
static inline void prof_leave(ProfOp prev) {
    if (prof_active) prof_switch(prev);
}
static inline void prof_switch_if(ProfOp op) {
    if (prof_active) prof_switch(op);
}
static inline void prof_bytes(uint64_t bytes) {
    if (prof_active) prof_add_bytes_to(prof_current(), bytes);
}

void prof_step_begin(void);   /* a decode step starts: PROF_LOOP is current */
void prof_step_forward(void); /* the step runs its forward pass (counted once) */
void prof_step_end(void);
/* The totals so far, the time of the op current now included. */
void prof_snapshot(ProfStats *out);
/* " prof_steps=N prof_token_ms=.. prof_<op>_ms=.. prof_<op>_bytes=.. prof_<op>_gbs=.." per decode
 * step between two snapshots, appended to buf (the END frame's fields). */
void prof_fields(const ProfStats *from, const ProfStats *to, char *buf, size_t n);

#endif
