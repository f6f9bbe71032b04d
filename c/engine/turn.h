/* The per-request pieces of a turn (turn.c), below the protocol loop that calls them. */
#ifndef COLI_TURN_H
#define COLI_TURN_H
#include "engine/engine.h"
#include "engine/protocol.h"

/* validates and tokenizes a SUBMIT's prompt; 0 with *ids (malloc'd), or -1 after
 * sending the request's ERROR frame. */
int engine_prompt(Engine *e, const Frame *f, const char *payload, int32_t **ids, int *n);
/* a teacher-forced logits=1 request, answered at once in a cache of its own. */
void engine_run_logits(Engine *e, const Frame *f, const int32_t *ids, int n);
/* one LOGPROB line; -1 when no memory was left for it. */
int engine_emit_logprob(const Engine *e, const char *id, const float *logits, int tok, int k);
int engine_is_eos(const Arch *a, int tok);
/* writes the slot to --kv-dir (nothing without one). */
void engine_persist_slot(Engine *e, int slot);
/* Appends the KV writer's END fields (kv_queue_peak_bytes, kv_writer_waits) to buf; nothing without --kv-dir. */
void engine_persist_fields(Engine *e, char *buf, size_t n);

#endif
