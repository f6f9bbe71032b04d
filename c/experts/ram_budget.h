/* The RAM budget split (docs/architecture.md, "Expert streaming"): a pure function of the
 * sizes, so `coli plan` can reproduce it and a unit test can pin it down.
 *   dense + kv + runtime + checkpoints + grammar + persist + pass are fixed (an automatic pass,
 *   sized from the spare, is not part of the minimum); the grammar's mask cache is elastic
 *   (a 16th of what the budget has beyond its minimum, at most GRAMMAR_MASK_CACHE_MAX); the
 *   expert cache gets the rest, in whole slots:
 *   cap = min(E, floor((ram - fixed - mask_cache) / (moe_layers * slot_bytes))). */
#ifndef COLI_RAM_BUDGET_H
#define COLI_RAM_BUDGET_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t ram; /* budget in bytes; 0: none */
    uint64_t dense, kv, runtime;
    uint64_t checkpoints;    /* turn-boundary copies of recurrent state and rings, every slot */
    uint64_t grammar;        /* the grammar's vocabulary trie and per-run scratch; 0: no tokenizer */
    uint64_t persist;        /* what the --kv-dir writer may hold (kv_writer_reserve); 0: no --kv-dir */
    uint64_t pass;           /* a prefill pass's activations beyond one batch (prefill_pass_bytes) */
    int pass_auto;           /* the pass was sized by ram_budget_pass: it is not part of min_ram */
    int moe_layers, experts; /* experts: E of the widest MoE layer (0 without MoE) */
    uint64_t slot_bytes;     /* what one cached expert costs */
    int cap;                 /* --cap; 0: derive it */
} BudgetIn;

typedef struct {
    int streaming;       /* 0: every expert stays mapped (no --ram, no --cap) */
    int cap;             /* slots per MoE layer (E when resident) */
    uint64_t cache;      /* bytes of the expert cache: moe_layers * cap * slot_bytes */
    uint64_t min_ram;    /* smallest budget that fits (cap 1, or the --cap given) */
    uint64_t mask_cache; /* bytes the grammar's token-mask cache may hold, all runs together */
} BudgetOut;

#define GRAMMAR_MASK_CACHE_MAX (64ull << 20) /* masks past this are rebuilt on use, not kept */
#define GRAMMAR_MASK_CACHE_SHARE 16          /* the mask cache takes 1/16 of the spare budget */

/* 0 ok; -1 when it does not fit or --cap is out of range, with err naming the numbers. */
int ram_budget_split(const BudgetIn *in, BudgetOut *out, char *err, size_t errlen);

/* The longest prefill pass (positions, a multiple of batch) a streaming budget gives: want,
 * unless the pass's bytes beyond one batch (pos_bytes a position) would take more than half of
 * what the budget has beyond its minimum and the mask cache (out: the split at a pass of one
 * batch). No budget (in->ram 0): want. Sets *limited when the budget shortened it. */
int ram_budget_pass(const BudgetIn *in, const BudgetOut *out, int want, int batch, uint64_t pos_bytes, int *limited);

#endif
