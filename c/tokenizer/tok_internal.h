/* Internals shared by the tokenizer files (tokenizer.c, tok_bpe.c, tok_pretok.c, tok_regex.c,
 * tok_normalize.c, tok_stream.c; the helpers in tok_buf.c). Not part of the engine-facing API (that is tokenizer.h). */
#ifndef COLI_TOK_INTERNAL_H
#define COLI_TOK_INTERNAL_H
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 (inputs are validated once at the API boundary, so decoders trust them) ---- */

static inline uint32_t u8_decode(const unsigned char *s, size_t *adv) {
    unsigned c = s[0];
    if (c < 0x80) {
        *adv = 1;
        return c;
    }
    if (c < 0xE0) {
        *adv = 2;
        return ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    }
    if (c < 0xF0) {
        *adv = 3;
        return ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    }
    *adv = 4;
    return ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
}

static inline size_t u8_encode(unsigned char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if invalid/truncated (overlongs and
 * surrogates are invalid, as in Rust's str). */
size_t tok_u8_valid_len(const unsigned char *s, size_t n);
/* Byte offset of the first invalid UTF-8 sequence, or n when s is valid. */
size_t tok_u8_first_invalid(const unsigned char *s, size_t n);

/* ---- growable byte buffer ---- */
typedef struct {
    unsigned char *p;
    size_t n, cap;
    int oom;
} TokBuf;
int tok_buf_reserve(TokBuf *b, size_t extra); /* 0 ok, -1 out of memory (sticky in b->oom) */
static inline int tok_buf_put(TokBuf *b, const void *s, size_t n) {
    if (tok_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* ---- growable int32 vector ---- */
typedef struct {
    int32_t *v;
    size_t n, cap;
    int oom;
} TokIds;
int tok_ids_push(TokIds *a, int32_t id);

/* ---- byte-level (GPT-2) byte <-> char map, as arithmetic instead of a mutable table ----
 * Printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to themselves; the other 68 bytes map
 * to U+0100.. in byte order. */
static inline uint32_t tok_byte_char(unsigned b) {
    if (b <= 0x20) return 256 + b;
    if (b >= 0x7F && b <= 0xA0) return 256 + 33 + (b - 0x7F);
    if (b == 0xAD) return 256 + 67;
    return b;
}
static inline int tok_char_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp >= 256 && cp <= 256 + 32) return (int)(cp - 256);
    if (cp >= 256 + 33 && cp <= 256 + 66) return (int)(0x7F + cp - 256 - 33);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}

/* ---- normalizers (tok_normalize.c) ---- */
enum { TOK_NORM_NFC = 1, TOK_NORM_NFD = 2, TOK_NORM_PREPEND = 3, TOK_NORM_REPLACE = 4 };
/* One normalizer step: PREPEND puts `a` before non-empty text (SentencePiece's "▁"); REPLACE
 * replaces every occurrence of the string `a` by `b`. */
typedef struct {
    int kind;
    char *a, *b;
    size_t an, bn;
} TokNorm;
/* Applies the steps in order. at_start: the text begins a segment (PREPEND acts only there).
 * Returns 0 with *out set (either s itself when unchanged, or buf->p) or -1 on out-of-memory. */
int tok_normalize(const TokNorm *steps, int nsteps, int at_start, const unsigned char *s, size_t n, TokBuf *buf,
                  const unsigned char **out, size_t *out_len);

#endif

/* ---- hash maps (tok_bpe.c) ---- */
/* Byte-string -> id map; keys are copied into an internal pool. */
typedef struct {
    uint32_t *slots; /* index+1 into ents, 0 = empty */
    size_t cap;      /* power of two */
    struct TokStrEnt {
        uint64_t hash;
        uint32_t off, len;
        int32_t id;
    } *ents;
    size_t n, ents_cap;
    TokBuf pool;
} TokStrMap;
int tok_strmap_put(TokStrMap *m, const void *key, size_t len, int32_t id); /* replaces; 0 ok / -1 oom */
int32_t tok_strmap_get(const TokStrMap *m, const void *key, size_t len);   /* -1 if absent */
void tok_strmap_free(TokStrMap *m);
int tok_strmap_reserve(TokStrMap *m, size_t n); /* room for n keys without rehashing */

/* ---- BPE model (tok_bpe.c) ---- */
typedef struct TokBpe TokBpe;
typedef struct {
    int byte_units; /* 1: the model sees raw bytes (ByteLevel); 0: UTF-8 characters */
    int ignore_merges;
    int rank_mode; /* no merges in the file: merge the pair whose concatenation has the lowest id */
    int byte_fallback;
    int fuse_unk;
    int32_t unk_id; /* -1 when no unk_token; -2 when unk_token is not in the vocab */
} TokBpeOpts;
TokBpe *tok_bpe_new(void);
void tok_bpe_free(TokBpe *b);
TokBpeOpts *tok_bpe_opts(TokBpe *b);
/* Model-domain key (raw bytes when byte_units) of a vocab token. */
int tok_bpe_reserve(TokBpe *b, size_t ntokens, size_t nmerges);
int tok_bpe_add_token(TokBpe *b, const unsigned char *key, size_t len, int32_t id);
int32_t tok_bpe_lookup(const TokBpe *b, const unsigned char *key, size_t len);
/* Adds merge (a, b) -> new_id with the given rank; a later duplicate pair replaces the earlier. */
int tok_bpe_add_merge(TokBpe *b, int32_t a, int32_t bb, int32_t new_id, uint32_t rank);
int tok_bpe_finish(TokBpe *b, char *err, size_t errlen); /* after all tokens/merges */
/* Encodes one pre-tokenized piece, appending ids. 0 ok, -1 error (message in err). */
typedef struct TokBpeScratch TokBpeScratch;
int tok_bpe_encode(const TokBpe *b, const unsigned char *w, size_t n, TokIds *out, TokBpeScratch **scratch, char *err,
                   size_t errlen);
void tok_bpe_scratch_free(TokBpeScratch *s);

/* ---- pre-tokenizers (tok_pretok.c) ---- */
typedef struct {
    const unsigned char *p;
    size_t n;
} TokPiece;
typedef struct {
    TokPiece *v;
    size_t n, cap;
    int oom;
} TokPieces;
typedef struct TokArena TokArena; /* blocks that pieces point into, freed together */
void tok_arena_free(TokArena *a);

struct JsonValue;
typedef struct TokPreTok TokPreTok;
/* NULL pre_tokenizer (JSON null or absent) gives an empty sequence. */
TokPreTok *tok_pretok_load(const struct JsonValue *v, char *err, size_t errlen);
void tok_pretok_free(TokPreTok *pt);
int tok_pretok_has_byte_level(const TokPreTok *pt);
/* Splits one text segment; appends pieces (in the model's domain: raw bytes after ByteLevel). */
int tok_pretok_run(const TokPreTok *pt, const unsigned char *s, size_t n, TokPieces *out, TokArena **arena, uint64_t *steps,
                   char *err, size_t errlen);
