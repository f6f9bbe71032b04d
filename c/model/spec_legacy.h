#ifndef COLI_SPEC_LEGACY_H
#define COLI_SPEC_LEGACY_H
#include <stddef.h>

#include "io/json.h"

/* {"trunk": {...}, "layers": [...]} for a manifest's arch that predates layer specs; NULL with
 * err set when the arch cannot be mapped. */
JsonDoc *legacy_specs(const JsonValue *arch, char *err, size_t errlen);

#endif
