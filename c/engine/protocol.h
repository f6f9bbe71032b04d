/* Launcher <-> engine frames (grammar in docs/protocol.md). Parsing is separate from I/O so
 * the C unit tests can feed it hostile input directly. */
#ifndef COLI_PROTOCOL_H
#define COLI_PROTOCOL_H
#include <stddef.h>
#include <stdint.h>

#include "engine/sampler.h"

#define PROTO_MAX_LINE 4096
#define PROTO_MAX_ID 64
#define PROTO_MAX_PAYLOAD (64u << 20)

typedef enum { FR_SUBMIT, FR_STOP, FR_CANCEL } FrameKind;

typedef struct {
    FrameKind kind;
    char id[PROTO_MAX_ID + 1];
    size_t payload_len;
    /* SUBMIT options */
    int slot;
    int ids;            /* payload is comma-separated token ids, not text */
    int logits;         /* teacher-forced: return logits for every position, generate nothing */
    int routing;        /* send a ROUTING frame (this turn's expert counts) before END */
    int progress;       /* send a PROGRESS frame after each prefill chunk */
    int max_tokens;     /* -1: until end of context */
    int fit;            /* max_tokens must fit in the context after the prompt, else context_exceeded */
    int parse_special;  /* special-token text in the prompt becomes special tokens */
    int add_special;    /* apply the tokenizer's post-processor (e.g. BOS) */
    int render_special; /* emit special tokens' text in DATA */
    int logprobs;       /* send a LOGPROB line after each DATA */
    int top_logprobs;   /* alternatives in each LOGPROB line (0-20) */
    size_t grammar;     /* the payload's first `grammar` bytes are a GBNF grammar constraining the output */
    size_t literal;     /* the next `literal` bytes list literal spans of the text after them */
    int ignore_eos;     /* generate past end-of-sequence tokens (benchmarks, fixed-length runs) */
    int has_seed;
    SamplerParams sp;
    SamplerPenalties pen;
} Frame;

/* Parses one header line (no trailing newline). 0 ok; -1 with err filled. On error *f->id is
 * the request id when it could be read, else "-". */
int frame_parse(const char *line, size_t len, Frame *f, char *err, size_t errlen);

/* Buffered, non-blocking reader of frames from a file descriptor. */
typedef struct {
    int fd;
    char *buf;
    size_t len, cap;
    int eof;
    size_t skip; /* payload bytes of a rejected frame still to discard */
    int oom;     /* the buffer could not grow: the frame being read is dropped, not the engine */
} FrameReader;

void reader_init(FrameReader *r, int fd);
void reader_free(FrameReader *r);
/* Reads what is available, waiting at most timeout_ms (-1: until something arrives). */
void reader_fill(FrameReader *r, int timeout_ms);
/* 1: a frame (and *payload, malloc'd, NUL-terminated) was taken; 0: need more input;
 * -1: a malformed frame was consumed, err/f->id describe it; -2: likewise, a well-formed frame
 * dropped because no memory was left to hold its payload (answer: out_of_memory). */
int reader_next(FrameReader *r, Frame *f, char **payload, char *err, size_t errlen);

/* Writers: one call writes one whole frame and flushes. */
void emit_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void emit_data(const char *id, int token, const char *bytes, size_t n);
void emit_error(const char *id, const char *type, const char *msg);
void emit_blob(const char *head, const void *bytes, size_t n); /* head line (with \n) then bytes */

#endif
