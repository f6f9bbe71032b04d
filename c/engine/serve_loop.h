/* The protocol loop with continuous batching (docs/protocol.md, "Concurrency"): up to
 * --parallel requests run at once, each on its own KV slot, and every decode step runs them
 * in one forward pass. turn.c keeps the per-request pieces the loop calls. */
#ifndef COLI_SERVE_LOOP_H
#define COLI_SERVE_LOOP_H
#include "engine/engine.h"
#include "engine/protocol.h"

/* Serves frames from `in` until EOF, then finishes what is running and queued. 0 ok; -1 when
 * the loop's own buffers could not be allocated. */
int serve_loop(Engine *e, FrameReader *in);

#endif
