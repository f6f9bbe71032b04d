/* The engine's frame input: frame_parse on the first line, then the whole input as a byte
 * stream through FrameReader (headers, payload lengths, skipped payloads, garbage). */
#include <fcntl.h>

#include "harness.h"
#include "engine/protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Frame f;
    char err[512];
    const uint8_t *nl = memchr(data, '\n', size);
    size_t line = nl ? (size_t)(nl - data) : size;
    if (frame_parse((const char *)data, line, &f, err, sizeof err) == 0) {
        if (f.kind == FR_SUBMIT && (f.payload_len > PROTO_MAX_PAYLOAD || f.slot < 0 || f.slot > 15 || f.top_logprobs < 0 ||
                                    f.top_logprobs > 20 || f.max_tokens < -1))
            abort();
    } else if (!err[0]) abort();

    const char *path = fuzz_write(fuzz_tmpdir(), "frames", data, size);
    int fd = open(path, O_RDONLY);
    if (fd < 0) abort();
    FrameReader r;
    reader_init(&r, fd);
    for (int rounds = 0; rounds < 100000; rounds++) {
        reader_fill(&r, 0);
        char *payload;
        int rc = reader_next(&r, &f, &payload, err, sizeof err);
        if (rc == 1) {
            if (strlen(payload) > f.payload_len) abort();
            free(payload);
        }
        if (rc == 0 && r.eof) break;
    }
    reader_free(&r);
    close(fd);
    return 0;
}
