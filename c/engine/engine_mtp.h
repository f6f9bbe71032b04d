/* --draft mtp in the engine: loading the head, one tracker per KV slot (mtp_draft.h), and what
 * the head reads outside the expert store. */
#ifndef COLI_ENGINE_MTP_H
#define COLI_ENGINE_MTP_H
#include "engine/engine.h"

/* Loads the model's MTP head and routes the forward pass's states to the slots' trackers. 0, or
 * -1 with err: no runnable head, or a head state that cannot be cut back. */
int engine_mtp_open(Engine *e, char *err, size_t errlen);
/* Once the expert store is set up: with streamed experts the head's own are read through the
 * page cache; stderr and READY (mtp_unbudgeted_bytes) say how many bytes that is. */
void engine_mtp_streaming(Engine *e);
void engine_mtp_close(Engine *e);
/* The tracker of main slot kv, set up on first use; NULL without a head, for a KV cache that is
 * not a slot, or out of memory (no drafts then, the same output). */
MtpTrack *engine_mtp_track(Engine *e, const KvCache *kv);

#endif
