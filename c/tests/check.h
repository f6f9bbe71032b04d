/* A tiny test harness: CHECK records a failure and continues; main prints "N passed, N failed". */
#ifndef COLI_CHECK_H
#define COLI_CHECK_H
#include <stdio.h>

extern int checks_passed, checks_failed;
#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (cond) checks_passed++;                                          \
        else {                                                              \
            checks_failed++;                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
        }                                                                   \
    } while (0)

void test_grow(void); /* grow_array: the growable-array doubling */
void test_quant(void);
void test_safetensors(void);
void test_protocol(void);
void test_grammar(void);
void test_json(void);
void test_sampler(void);
void test_sampler_top_p(void);
void test_tokenizer(void);
void test_blocks(void);
void test_kv_kernel_sets(void); /* the KV cache and attention kernels of every set */
void test_kernel_table(void);   /* every set's table complete or its fallbacks listed; --kernels governs every family */
void test_kv_persist(void);
void test_kv_log(void);
void test_logprob(void);
void test_expert_streaming(void);
void test_moe_exec(void);
void test_sampler_sort(void);
void test_router(void);
void test_attend_split(void);
void test_delta_rule(void);
void test_matmul_fused(void); /* one parallel region over a group's matrices, bit for bit */
void test_scratch(void);      /* per-thread scratch buffers, freed when their thread ends */
void test_huge_alloc(void);   /* huge-page memory, aligned file maps, a mapped range taken over */

#endif
