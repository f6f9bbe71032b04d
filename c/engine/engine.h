/* The protocol loop: one loaded model, up to 16 KV slots, requests served in arrival order. */
#ifndef COLI_ENGINE_H
#define COLI_ENGINE_H
#include "experts/expert_store.h"
#include "model/model.h"
#include "experts/ram_budget.h"
#include "experts/usage.h"
#include "engine/mtp_draft.h"

#define MAX_KV_SLOTS 16

typedef struct Tokenizer Tokenizer;
typedef struct EngineGrammar EngineGrammar;

typedef struct {
    Model model;
    Tokenizer *tok; /* NULL when the container has no tokenizer.json */
    int ctx, n_slots;
    int parallel;                /* requests decoded together, at most n_slots (--parallel) */
    KvCache slots[MAX_KV_SLOTS]; /* allocated on first use */
    const char *kv_dir;          /* persist slots here when set */
    struct KvWriter *kv_writer;  /* writes them off the request path (kv_writer.h) */
    int disk_n[MAX_KV_SLOTS];    /* positions of each slot the records sent so far describe */
    int low_water[MAX_KV_SLOTS]; /* lowest position each slot was cut back to since its last record */
    int kv_lock_fd;              /* holds kv_dir's lock (kv_dir.h) while open; -1 without kv_dir */
    uint64_t fingerprint;        /* of the model, stamped into persisted slots */
    ExpertStore store;           /* routed experts: mapped, or streamed through a cache */
    BudgetIn budget_in;          /* the RAM budget split (READY, the start-up line) */
    BudgetOut budget;
    const char *pass_why; /* why the prefill pass is forward_prefill_pass long (READY prefill_pass_why) */
    Usage usage;          /* .coli_usage: routing counts over turns */
    int usage_warned;
    EngineGrammar *grammar;     /* constrained decoding (engine_grammar.h); NULL until a request has one */
    int draft_mode;             /* DRAFT_* (draft.h): --draft, turned off where the model's state cannot be cut back */
    int draft_max;              /* --draft-max */
    int draft_fixed;            /* --draft-adapt off: always draft draft_max tokens where a match exists */
    const char *draft_off;      /* why drafting is off although asked for, or NULL */
    MtpTrack mtp[MAX_KV_SLOTS]; /* --draft mtp: each slot's MTP head state (set up on first use) */
} Engine;

typedef struct {
    const char *model_dir;
    int ctx, kv_slots, threads, batch, portable;
    int prefill_pass; /* --prefill-pass; 0: automatic */
    int parallel;     /* --parallel; 0: every KV slot */
    int kernels;      /* KernIsa + 1 from --kernels; 0: the best this CPU runs */
    const char *kv_dir;
    int skip_tokenizer; /* logits needs none, and a broken one must not block it */
    QType kv_type;      /* --kv: KV cache element type, when kv_set */
    int kv_set;
    double ram_gb;   /* --ram; 0: none */
    int cap;         /* --cap; 0: none */
    int no_direct;   /* --no-direct */
    int readahead;   /* --readahead: 0 default, 1 on, 2 off */
    int pin_off;     /* --pin off (default auto) */
    int io_threads;  /* --io-threads; 0: default */
    int logits_rows; /* one-shot `colibri logits`: positions it holds (its KV and logits) */
    int draft;       /* --draft: DRAFT_* + 1; 0: default (off) */
    int draft_max;   /* --draft-max; 0: DRAFT_DEFAULT_MAX */
    int draft_fixed; /* --draft-adapt off */
    int profile;     /* --profile: the per-op decode profile in END (util/op_prof.h) */
} EngineOptions;

/* Parses the shared engine flags; returns the index of the first unparsed argument or -1. */
int engine_parse_options(int argc, char **argv, int start, EngineOptions *o, char *err, size_t errlen);
/* For the one-shot commands (logits, calibrate): argv[*i] is `flag VALUE`: *dst = VALUE, *i past
 * it, 1; else 0. */
int engine_take_arg(int argc, char **argv, int *i, const char *flag, const char **dst);
/* The shared engine flags at argv[i] for one-shot command cmd: the next index, or -1 after saying
 * on stderr what is wrong (a bad value, or an argument neither cmd nor the engine takes, followed
 * by usage unless NULL). */
int engine_command_option(int argc, char **argv, int i, EngineOptions *o, const char *cmd, const char *usage);
/* 0, or err says why: ENGINE_BUSY when another engine holds --kv-dir (a retry may succeed once
 * it exits), -1 for anything else. */
#define ENGINE_BUSY (-2)
int engine_open(Engine *e, const EngineOptions *o, char *err, size_t errlen);
void engine_close(Engine *e);
int engine_serve(Engine *e); /* runs until EOF on stdin */
/* Parses "1,2,3" into ids checked against vocab. 0 ok; -1 with err filled. */
int parse_ids(const char *s, int vocab, int32_t **ids, int *n, char *err, size_t errlen);

#endif
