/* Unicode property lookups backed by the generated c/tokenizer/unicode_tables.c
 * (tools/gen_unicode_tables.py; versions in uni_version / uni_norm_version). */
#ifndef COLI_UNICODE_TABLES_H
#define COLI_UNICODE_TABLES_H
#include <stddef.h>
#include <stdint.h>

/* General categories, in the generator's CATS order. */
enum {
    UNI_Cn,
    UNI_Lu,
    UNI_Ll,
    UNI_Lt,
    UNI_Lm,
    UNI_Lo,
    UNI_Mn,
    UNI_Mc,
    UNI_Me,
    UNI_Nd,
    UNI_Nl,
    UNI_No,
    UNI_Pc,
    UNI_Pd,
    UNI_Ps,
    UNI_Pe,
    UNI_Pi,
    UNI_Pf,
    UNI_Po,
    UNI_Sm,
    UNI_Sc,
    UNI_Sk,
    UNI_So,
    UNI_Zs,
    UNI_Zl,
    UNI_Zp,
    UNI_Cc,
    UNI_Cf,
    UNI_Cs,
    UNI_Co,
    UNI_NCATS
};
#define UNI_CAT_MASK 0x1f
#define UNI_F_SPACE 0x20      /* White_Space property (what Oniguruma's \s matches) */
#define UNI_F_NFC_UNSAFE 0x40 /* may change under NFC (ccc != 0, composes with previous, or not NFC) */

extern const char uni_version[];      /* Unicode version of the category tables */
extern const char uni_norm_version[]; /* Unicode version of the NFC data */

uint8_t uni_props(uint32_t cp); /* category | flags; 0 (Cn) beyond U+10FFFF */
static inline int uni_cat(uint32_t cp) { return uni_props(cp) & UNI_CAT_MASK; }
int uni_ccc(uint32_t cp);                           /* canonical combining class */
const uint32_t *uni_decomp(uint32_t cp, size_t *n); /* full canonical decomposition, NULL if none (Hangul excluded) */
uint32_t uni_compose(uint32_t a, uint32_t b);       /* primary composite of a+b, 0 if none (Hangul excluded) */

#endif
