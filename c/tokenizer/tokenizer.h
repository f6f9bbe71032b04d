/* BPE tokenizer reading a checkpoint's tokenizer.json, token-for-token equal to HF `tokenizers`
 * (added tokens, NFC/NFD/Prepend/Replace normalizers, Split/ByteLevel/Digits pre-tokenizers, BPE
 * merges with byte fallback, TemplateProcessing; ByteLevel or SentencePiece-style decoders). A loaded Tokenizer is read-only: concurrent tok_encode calls are safe. */
#ifndef COLI_TOKENIZER_H
#define COLI_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;

Tokenizer *tok_load(const char *tokenizer_json_path, char *err, size_t errlen); /* NULL + message on failure */
/* Same from an in-memory tokenizer.json (len bytes). */
Tokenizer *tok_load_buffer(const char *json, size_t len, char *err, size_t errlen);
void tok_free(Tokenizer *t);
int tok_vocab_size(const Tokenizer *t); /* max id + 1 over vocab and added tokens */

/* Encode UTF-8 text. parse_special: match special added tokens in text (non-special added
 * tokens such as <think> always match, as in HF). add_special: apply the post_processor (e.g.
 * BOS) like HF add_special_tokens=True. Invalid UTF-8 is rejected (HF takes a str).
 * Returns 0, or -1 with err filled. *ids_out is malloc'd; caller frees. */
int tok_encode(const Tokenizer *t, const char *text, size_t len, int parse_special, int add_special, int32_t **ids_out,
               size_t *n_out, char *err, size_t errlen);

/* tok_encode with literal spans: npairs byte ranges [pairs[2i], pairs[2i+1]) of text, ascending
 * and disjoint, inside which no added token (special or not) matches; a token cannot straddle
 * a span's edge either. The spans' text is ordinary text for the normalizer, pre-tokenizer and
 * BPE, joined with the text around it, so a span holding a special token's text encodes as HF's
 * encode_special_tokens=True would encode it. Outside the spans nothing changes. */
int tok_encode_literal(const Tokenizer *t, const char *text, size_t len, int parse_special, int add_special, const size_t *pairs,
                       size_t npairs, int32_t **ids_out, size_t *n_out, char *err, size_t errlen);
/* Parses a literal span list "START-END[,START-END...]" (docs/protocol.md) into malloc'd pairs. */
int tok_literal_parse(const char *spec, size_t n, size_t **pairs, size_t *npairs, char *err, size_t errlen);
/* 0 when the spans are non-empty, ascending, disjoint, inside text and on character starts. */
int tok_literal_check(const char *text, size_t len, const size_t *pairs, size_t npairs, char *err, size_t errlen);

/* Decoded bytes of one token (byte-level map undone, like HF's ByteLevel decoder); NULL if id
 * invalid. The bytes may be an incomplete UTF-8 sequence. */
const char *tok_token_bytes(const Tokenizer *t, int32_t id, size_t *len);
int tok_is_special(const Tokenizer *t, int32_t id);              /* added token with special=true */
int tok_is_added(const Tokenizer *t, int32_t id);                /* an added token, special or not */
int32_t tok_find(const Tokenizer *t, const char *token_content); /* id by content (added first, then vocab), -1 if none */
size_t tok_max_token_bytes(const Tokenizer *t);                  /* longest tok_token_bytes */

int tok_is_byte(const Tokenizer *t, int32_t id); /* a <0xNN> token of a ByteFallback decoder */
int tok_strip_start(const Tokenizer *t);         /* leading spaces the decoder strips (Strip) */

/* Streaming decode: holds back incomplete UTF-8, never drops bytes. The concatenated output
 * equals HF decode(ids): String::from_utf8_lossy of all token bytes for byte-level decoders;
 * with ByteFallback, a run of <0xNN> tokens is held until it ends and becomes its text, or one
 * U+FFFD per byte when it is not valid UTF-8, and a Strip decoder's leading spaces go. */
#define TOK_STREAM_GROUP 64 /* longest run of byte tokens held back (longer runs are cut there) */
typedef struct TokStream {
    unsigned char pending[8];
    size_t npending;
    unsigned char group[TOK_STREAM_GROUP];
    size_t ngroup;
    int strip_left, started;
} TokStream;
void tok_stream_init(TokStream *s);
/* Appends the text for id to out (cap bytes), returns bytes written; special tokens produce
 * nothing unless render_special. cap >= tok_stream_cap(t) always suffices; with a smaller
 * cap the output is cut at a character boundary. */
size_t tok_stream_push(const Tokenizer *t, TokStream *s, int32_t id, int render_special, char *out, size_t cap);
size_t tok_stream_flush(TokStream *s, char *out,
                        size_t cap);       /* remaining bytes (invalid tails emitted as U+FFFD like HF decode) */
size_t tok_stream_cap(const Tokenizer *t); /* worst-case output of one push */

/* Unicode versions of the compiled-in tables (categories, NFC). */
const char *tok_unicode_version(void);
const char *tok_unicode_norm_version(void);

#endif
