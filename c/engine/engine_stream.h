/* The engine's side of expert streaming: the RAM budget split at start-up, the expert store's
 * READY and END fields, the ROUTING frame and `.coli_usage` (docs/protocol.md). */
#ifndef COLI_ENGINE_STREAM_H
#define COLI_ENGINE_STREAM_H
#include "engine/engine.h"

/* Splits the budget (threads: the compute team's size), prints it, and switches the store to
 * streaming when asked. 0 ok; -1 with err (a budget that cannot fit names the smallest --ram). */
int engine_stream_open(Engine *e, const EngineOptions *o, int threads, char *err, size_t errlen);
void engine_stream_close(Engine *e);
/* The READY fields, " ram_budget=... readahead=N". */
void engine_stream_ready(const Engine *e, char *buf, size_t n);
void engine_stream_turn_begin(Engine *e);
/* The END fields of the turn that ran turn_ms, " hits=... experts_total=N". */
void engine_stream_end_fields(Engine *e, double turn_ms, char *buf, size_t n);
/* Sends the turn's ROUTING frame for request id. */
void engine_stream_routing(const Engine *e, const char *id);
/* Adds the turn's routing to .coli_usage and writes it (a failure warns once). */
void engine_stream_learn(Engine *e);
/* Turns that overlap (continuous batching) share the store's counters, which run from the
 * engine's last idle moment (engine_stream_turn_begin); a turn's END fields and ROUTING are
 * what the counters gained since its mark: every forward pass that ran during the turn, other
 * requests' rows in the same passes included. */
typedef struct {
    ExpertStats st;
    uint32_t *counts; /* [moe_layers][experts]; NULL without MoE or without memory (ROUTING: all) */
} TurnMark;
void engine_stream_mark(Engine *e, TurnMark *m);
void engine_stream_mark_free(TurnMark *m);
/* The expert reads since the mark (the whole store's, other requests' included). */
ExpertStats engine_stream_since(Engine *e, const TurnMark *m);
/* Appends END's prefill_bytes_read and prefill_io_wait_ms: the reads of the prompt, d. */
void engine_stream_prefill_fields(const ExpertStats *d, char *buf, size_t n);
/* As engine_stream_end_fields and engine_stream_routing, for what happened since the mark. */
void engine_stream_end_since(Engine *e, const TurnMark *m, double turn_ms, char *buf, size_t n);
void engine_stream_routing_since(const Engine *e, const TurnMark *m, const char *id);

/* Bytes of scratch the forward pass and the protocol loop need beyond weights and KV, with
 * `streams` requests decoding at once (--parallel). */
/* Floats of one thread's attention scratch at most for `heads` query heads of hd over ctx
 * positions: kv_attend_block_positions' blocks of up to 64 query rows (a group's heads at
 * least), fewer past 4M floats of scores, as kv_attend_scratch sizes them. */
uint64_t attend_scratch_floats(uint64_t heads, uint64_t hd, uint64_t ctx);
uint64_t engine_runtime_bytes(const Model *m, int batch, int ctx, int threads, int logits_rows, uint64_t tokenizer_bytes,
                              int streams);

/* Bytes one more prefill pass position holds over ctx positions (its working floats, a DSA
 * selection row, and its logits for `colibri logits`). */
uint64_t engine_pass_pos_bytes(const Model *m, int ctx, int logits_rows);

#define RUNTIME_BASE_BYTES (16ull << 20) /* binary, libc/libgomp, thread stacks, the JSON manifest */

#endif
