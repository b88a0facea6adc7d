/* Bad input through the CLI: each broken checkpoint or argument must give a clear
 * error naming what is wrong and a non-zero exit, never a crash. Broken checkpoints
 * are built in a temporary directory from a fixture. The qdelta binary comes from
 * $QDELTA_BIN (set by ctest). */
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qd_test.h"

#define SRC "tests/fixtures/qwen3_next_moe_f32"

static const char *bin;
static char tmp[256];

static void spit(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, len, f);
    fclose(f);
}

/* A fresh copy of the source fixture's config.json and model.safetensors in tmp/NAME. */
static void make_dir(const char *name, char *dir, size_t n) {
    snprintf(dir, n, "%s/%s", tmp, name);
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char src[512], dst[512];
        size_t len = 0;
        snprintf(src, sizeof src, "%s/%s", SRC, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        char *b = qd_test_read_file(src, &len);
        spit(dst, b, len);
        free(b);
    }
}

/* Replaces the first occurrence of `from` by `to` (same length) in a file. */
static int patch(const char *dir, const char *file, const char *from, const char *to) {
    char path[512];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *b = qd_test_read_file(path, &len);
    size_t fl = strlen(from);
    for (size_t i = 0; i + fl <= len; i++) {
        if (!memcmp(b + i, from, fl)) {
            memcpy(b + i, to, strlen(to));
            spit(path, b, len);
            free(b);
            return 0;
        }
    }
    free(b);
    return -1;
}

/* Runs qdelta with args; checks a clean non-zero exit and that stderr names `expect`. */
static void expect_error(const char *what, const char *args, const char *expect) {
    char cmd[2048], errf[300];
    snprintf(errf, sizeof errf, "%s/stderr.txt", tmp);
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s", bin, args, errf);
    int st = system(cmd);
    char *msg = qd_test_read_file(errf, NULL);
    int clean = st != -1 && WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) < 64;
    CHECKF(clean, "%s: expected a clean error exit, got status %d", what, st);
    CHECKF(msg && strstr(msg, expect), "%s: stderr does not mention '%s': %s", what, expect, msg ? msg : "(none)");
    if (msg) printf("  %-28s -> %s", what, msg);
    free(msg);
}

static void write_ids(const char *name, const char *text) {
    char p[300];
    snprintf(p, sizeof p, "%s/%s", tmp, name);
    spit(p, text, strlen(text));
}

int main(void) {
    bin = getenv("QDELTA_BIN");
    if (!bin) bin = "build/qdelta";
    if (access(bin, X_OK) != 0) {
        CHECKF(0, "qdelta binary not found at %s (set QDELTA_BIN)", bin);
        return qd_test_finish("test_bad_inputs");
    }
    snprintf(tmp, sizeof tmp, "/tmp/qdelta-bad-XXXXXX");
    CHECK(mkdtemp(tmp) != NULL);
    write_ids("ok.ids", "1 2 3 4 5\n");
    write_ids("range.ids", "1 2 99999 4\n");
    write_ids("garbage.ids", "1 2 three 4\n");
    write_ids("empty.ids", "  \n");
    char dir[300], args[1024];

    /* sanity: the unmodified copy works */
    make_dir("good", dir, sizeof dir);
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/ok.ids -o %s/out.f32", dir, tmp, tmp);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s %s", bin, args);
    CHECK(system(cmd) == 0);

    make_dir("missing_tensor", dir, sizeof dir);
    CHECK(patch(dir, "model.safetensors", "\"model.norm.weight\"", "\"model.norX.weight\"") == 0);
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/ok.ids -o %s/out.f32", dir, tmp, tmp);
    expect_error("missing tensor", args, "model.norm.weight");

    make_dir("wrong_shape", dir, sizeof dir);
    CHECK(patch(dir, "model.safetensors", "\"shape\":[64,96]", "\"shape\":[96,64]") == 0);
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/ok.ids -o %s/out.f32", dir, tmp, tmp);
    expect_error("wrong shape", args, "expected shape [64, 96], got [96, 64]");

    make_dir("unknown_type", dir, sizeof dir);
    CHECK(patch(dir, "config.json", "\"qwen3_next\"", "\"llama_next\"") == 0);
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/ok.ids -o %s/out.f32", dir, tmp, tmp);
    expect_error("unknown model_type", args, "qwen3_5_moe");

    make_dir("missing_field", dir, sizeof dir);
    CHECK(patch(dir, "config.json", "\"hidden_size\"", "\"hidden_sizX\"") == 0);
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/ok.ids -o %s/out.f32", dir, tmp, tmp);
    expect_error("missing config field", args, "hidden_size");

    make_dir("bad_json", dir, sizeof dir);
    spit(strcat(strcpy(cmd, dir), "/config.json"), "{\"model_type\": \"qwen3_next\",", 28);
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/ok.ids -o %s/out.f32", dir, tmp, tmp);
    expect_error("malformed config.json", args, "config.json");

    make_dir("truncated", dir, sizeof dir);
    {
        char p[400];
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        struct stat st;
        stat(p, &st);
        CHECK(truncate(p, st.st_size / 2) == 0);
    }
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/ok.ids -o %s/out.f32", dir, tmp, tmp);
    expect_error("truncated safetensors", args, "model.safetensors");

    make_dir("absurd_header", dir, sizeof dir);
    {
        char p[400];
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        FILE *f = fopen(p, "r+b");
        unsigned char huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
        fwrite(huge, 1, 8, f);
        fclose(f);
    }
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/ok.ids -o %s/out.f32", dir, tmp, tmp);
    expect_error("absurd header length", args, "header");

    make_dir("overlap", dir, sizeof dir);
    {
        /* a hand-made file: two tensors whose byte ranges overlap */
        const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}";
        size_t hl = strlen(hdr);
        unsigned char buf[512] = {0};
        for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hl >> (8 * i));
        memcpy(buf + 8, hdr, hl);
        char p[400];
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        spit(p, buf, 8 + hl + 24);
    }
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/ok.ids -o %s/out.f32", dir, tmp, tmp);
    expect_error("overlapping tensors", args, "overlap");

    make_dir("ids", dir, sizeof dir);
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/range.ids -o %s/out.f32", dir, tmp, tmp);
    expect_error("token id out of range", args, "99999");
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/garbage.ids -o %s/out.f32", dir, tmp, tmp);
    expect_error("malformed ids", args, "three");
    snprintf(args, sizeof args, "logits -q -m %s --ids %s/empty.ids -o %s/out.f32", dir, tmp, tmp);
    expect_error("empty ids", args, "no token ids");
    snprintf(args, sizeof args, "run -q -m %s --prompt-ids \"1 2 400\" -n 2", dir);
    expect_error("run: id out of range", args, "400");
    snprintf(args, sizeof args, "logits -q -m %s/nonexistent --ids %s/ok.ids -o %s/out.f32", tmp, tmp, tmp);
    expect_error("missing directory", args, "nonexistent");
    snprintf(args, sizeof args, "run -q -m %s --prompt-ids \"1 2\" -n -3", dir);
    expect_error("negative -n", args, "-n");
    expect_error("unknown command", "frobnicate", "unknown command");

    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0);
    return qd_test_finish("test_bad_inputs");
}
