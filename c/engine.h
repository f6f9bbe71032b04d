/* The protocol loop: one loaded model, up to 16 KV slots, requests served in arrival order. */
#ifndef COLI_ENGINE_H
#define COLI_ENGINE_H
#include "model.h"

#define MAX_KV_SLOTS 16

typedef struct Tokenizer Tokenizer;

typedef struct {
    Model model;
    Tokenizer *tok; /* NULL when the container has no tokenizer.json */
    int ctx, n_slots;
    KvCache slots[MAX_KV_SLOTS]; /* allocated on first use */
    const char *kv_dir;          /* persist slots here when set */
    int kv_lock_fd;              /* holds kv_dir's lock (kv_dir.h) while open; -1 without kv_dir */
    uint64_t fingerprint;        /* of the model, stamped into persisted slots */
} Engine;

typedef struct {
    const char *model_dir;
    int ctx, kv_slots, threads, batch, portable;
    int kernels; /* KernIsa + 1 from --kernels; 0: the best this CPU runs */
    const char *kv_dir;
    int skip_tokenizer; /* logits needs none, and a broken one must not block it */
    QType kv_type;      /* --kv: KV cache element type, when kv_set */
    int kv_set;
} EngineOptions;

/* Parses the shared engine flags; returns the index of the first unparsed argument or -1. */
int engine_parse_options(int argc, char **argv, int start, EngineOptions *o, char *err, size_t errlen);
int engine_open(Engine *e, const EngineOptions *o, char *err, size_t errlen);
void engine_close(Engine *e);
int engine_serve(Engine *e); /* runs until EOF on stdin */
/* Parses "1,2,3" into ids checked against vocab. 0 ok; -1 with err filled. */
int parse_ids(const char *s, int vocab, int32_t **ids, int *n, char *err, size_t errlen);

#endif
