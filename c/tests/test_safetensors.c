/* The loader must refuse truncated, corrupt and hostile headers with a message, never crash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "io/container.h"
#include "io/safetensors.h"

static char tmpdir[256];

static const char *write_st(const char *name, const char *header, size_t data_len, int64_t fake_len) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    uint64_t n = fake_len >= 0 ? (uint64_t)fake_len : strlen(header);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_len; i++) fputc((int)i, f);
    fclose(f);
    return path;
}

static void expect_refused(const char *label, const char *header, size_t data_len, int64_t fake_len, const char *needle) {
    StFile f;
    char err[512] = "";
    const char *p = write_st("t.safetensors", header, data_len, fake_len);
    int rc = st_open(&f, p, err, sizeof err);
    CHECK(rc == -1, "%s: accepted", label);
    CHECK(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", label, err, needle);
    if (rc == 0) st_close(&f);
}

void test_safetensors(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/coli_ctest_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    StFile f;
    char err[512];
    const char *ok = write_st("ok.safetensors",
                              "{\"__metadata__\":{\"a\":\"b\"},\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                              "\"y\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}",
                              22, -1);
    CHECK(st_open(&f, ok, err, sizeof err) == 0, "valid file refused: %s", err);
    if (f.n == 2) {
        const StTensor *x = strcmp(f.tensors[0].name, "x") == 0 ? &f.tensors[0] : &f.tensors[1];
        CHECK(x->nbytes == 16 && x->ndim == 2 && x->shape[1] == 2 && x->data[0] == 0, "tensor x parsed");
        CHECK(f.metadata && json_get_str(f.metadata, "a") != NULL, "metadata parsed");
        st_close(&f);
    } else CHECK(0, "expected 2 tensors, got %zu", f.n);

    expect_refused("header longer than file", "{}", 0, 1000, "exceeds the file");
    expect_refused("huge header length", "{}", 0, (int64_t)1 << 40, "exceeds the file");
    expect_refused("bad json", "{\"x\":", 0, -1, "bad safetensors header");
    expect_refused("not an object", "[1,2]", 0, -1, "not a JSON object");
    expect_refused("unknown dtype", "{\"x\":{\"dtype\":\"Q9\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -1, "unknown dtype");
    expect_refused("size mismatch", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, -1, "need");
    expect_refused("past the end", "{\"x\":{\"dtype\":\"U8\",\"shape\":[100],\"data_offsets\":[0,100]}}", 10, -1, "truncated");
    expect_refused("reversed offsets", "{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[5,1]}}", 10, -1,
                   "bad data_offsets");
    expect_refused("negative dim", "{\"x\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, -1, "bad shape");
    expect_refused("overflowing shape",
                   "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, -1,
                   "overflows");
    expect_refused(
        "overlap",
        "{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"y\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
        8, -1, "overlap");
    expect_refused("missing fields", "{\"x\":{\"dtype\":\"U8\"}}", 0, -1, "lacks");
    expect_refused("non-string metadata", "{\"__metadata__\":{\"a\":1}}", 0, -1, "not a string");
    expect_refused(
        "deep nesting",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]",
        0, -1, "too deep");
    { /* a file shorter than the length prefix */
        char path[512];
        snprintf(path, sizeof path, "%s/short.safetensors", tmpdir);
        FILE *s = fopen(path, "wb");
        fwrite("abc", 1, 3, s);
        fclose(s);
        CHECK(st_open(&f, path, err, sizeof err) == -1 && strstr(err, "too short"), "3-byte file: %s", err);
    }
    CHECK(st_open(&f, "/nonexistent/x.safetensors", err, sizeof err) == -1 && strstr(err, "cannot open"), "missing file");

    /* container level: a directory without a manifest, and a manifest pointing outside */
    Container *c = ct_open(tmpdir, err, sizeof err);
    CHECK(!c && strstr(err, "colibri.json") && strstr(err, "coli convert"), "no manifest: %s", err);
    char mpath[512];
    snprintf(mpath, sizeof mpath, "%s/colibri.json", tmpdir);
    FILE *m = fopen(mpath, "w");
    fputs("{\"format\":\"colibri-container\",\"format_version\":1,\"shards\":[\"../etc/passwd\"]}", m);
    fclose(m);
    c = ct_open(tmpdir, err, sizeof err);
    CHECK(!c && strstr(err, "plain file name"), "path escape refused: %s", err);
    m = fopen(mpath, "w");
    fputs("{\"format\":\"colibri-container\",\"format_version\":99,\"shards\":[\"ok.safetensors\"]}", m);
    fclose(m);
    c = ct_open(tmpdir, err, sizeof err);
    CHECK(!c && strstr(err, "version 99"), "future format refused: %s", err);
    m = fopen(mpath, "w");
    fputs("{\"format\":\"colibri-container\",\"format_version\":1,\"shards\":[\"ok.safetensors\"]}", m);
    fclose(m);
    c = ct_open(tmpdir, err, sizeof err);
    CHECK(!c && strstr(err, "colibri.tensors"), "shard without storage metadata refused: %s", err);
    if (c) ct_close(c);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) CHECK(0, "cleanup");
}
