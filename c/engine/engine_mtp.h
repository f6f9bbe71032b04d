/* --draft mtp in the engine: loading the head and one tracker per KV slot (mtp_draft.h). The
 * head's routed experts are the expert store's last layer (engine_stream.c). */
#ifndef COLI_ENGINE_MTP_H
#define COLI_ENGINE_MTP_H
#include "engine/engine.h"

/* Loads the model's MTP head and routes the forward pass's states to the slots' trackers. 0, or
 * -1 with err: no runnable head, or a head state that cannot be cut back. */
int engine_mtp_open(Engine *e, char *err, size_t errlen);
void engine_mtp_close(Engine *e);
/* The tracker of main slot kv, set up on first use; NULL without a head, for a KV cache that is
 * not a slot, or out of memory (no drafts then, the same output). */
MtpTrack *engine_mtp_track(Engine *e, const KvCache *kv);

#endif
