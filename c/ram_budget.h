/* The RAM budget split (docs/architecture.md, "Expert streaming"): a pure function of the
 * sizes, so `coli plan` can reproduce it and a unit test can pin it down.
 *   dense + kv + runtime are fixed; the expert cache gets the rest, in whole slots:
 *   cap = min(E, floor((ram - dense - kv - runtime) / (moe_layers * slot_bytes))). */
#ifndef COLI_RAM_BUDGET_H
#define COLI_RAM_BUDGET_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t ram;        /* budget in bytes; 0: none */
    uint64_t dense, kv, runtime;
    int moe_layers, experts; /* experts: E of the widest MoE layer (0 without MoE) */
    uint64_t slot_bytes;     /* what one cached expert costs */
    int cap;                 /* --cap; 0: derive it */
} BudgetIn;

typedef struct {
    int streaming;        /* 0: every expert stays mapped (no --ram, no --cap) */
    int cap;              /* slots per MoE layer (E when resident) */
    uint64_t cache;       /* bytes of the expert cache: moe_layers * cap * slot_bytes */
    uint64_t min_ram;     /* smallest budget that fits (cap 1, or the --cap given) */
} BudgetOut;

/* 0 ok; -1 when it does not fit or --cap is out of range, with err naming the numbers. */
int ram_budget_split(const BudgetIn *in, BudgetOut *out, char *err, size_t errlen);

#endif
