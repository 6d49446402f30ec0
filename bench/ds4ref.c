/* ds4ref: a driver for antirez/ds4's own engine (CPU backend), so ds4tui can be checked
 * against ds4 on the same GGUF. Linked against an unmodified ds4 build's ds4_cpu.o and
 * ds4_kvstore.o (built with ds4's layer-count enum set to the file's N: bench/ds4_reference.sh
 * does it, under /tmp). It uses ds4's public API only (ds4.h, ds4_kvstore.h).
 *
 *   ds4ref MODEL logits --tokens 1,2,3 [--steps K] --out FILE
 *       prefill the tokens (ds4_session_sync), then K greedy steps (ds4_session_argmax +
 *       ds4_session_eval); FILE gets K+1 rows of vocab float32 logits (the next-token logits
 *       after the prompt, then after each greedy token); stdout: "greedy: t1 t2 ...".
 *   ds4ref MODEL save --tokens 1,2,3 --dir DIR
 *       prefill, then store the live session in DIR as ds4-server does
 *       (ds4_kvstore_store_live_prefix, reason "cold"); stdout: "saved: PATH".
 *   ds4ref MODEL resume --file KV [--steps K] --out FILE [--dir DIR]
 *       read a .kv file (ds4's header, the text, then ds4_session_load_payload), write the
 *       restored logits and K greedy steps as `logits` does; with --dir, store the session
 *       after those steps in DIR (so a session can go on to the next program).
 * Common: --ctx N (default 4096), --threads N (default 2).
 *
 * Full logits come from the engine's own payload: ds4_session_save_snapshot writes the
 * 13-u32 header, the T tokens, then the vocab logits (docs/payload.md), read at 52 + 4T. */
#include "ds4.h"
#include "ds4_kvstore.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *msg) {
    fprintf(stderr, "ds4ref: %s\n", msg);
    exit(2);
}

static void parse_tokens(const char *s, ds4_tokens *out) {
    while (*s) {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0) die("--tokens wants comma-separated token ids");
        ds4_tokens_push(out, (int)v);
        s = *end == ',' ? end + 1 : end;
    }
}

/* The session's next-token logits, from its serialized payload. */
static void write_logits(ds4_session *s, FILE *out) {
    ds4_session_snapshot snap = {0};
    char err[256] = {0};
    if (ds4_session_save_snapshot(s, &snap, err, sizeof(err)) != 0) die(err);
    uint32_t h[13];
    if (snap.len < sizeof(h)) die("snapshot shorter than its header");
    memcpy(h, snap.ptr, sizeof(h));
    const uint64_t off = sizeof(h) + 4ull * h[7];
    const uint64_t n = h[11];
    if (off + 4ull * n > snap.len) die("snapshot shorter than its logits");
    if (fwrite(snap.ptr + off, 4, n, out) != n) die("cannot write logits");
    ds4_session_snapshot_free(&snap);
}

static void greedy(ds4_session *s, int steps, FILE *out) {
    char err[256] = {0};
    printf("greedy:");
    for (int i = 0; i < steps; i++) {
        const int tok = ds4_session_argmax(s);
        printf(" %d", tok);
        if (ds4_session_eval(s, tok, err, sizeof(err)) != 0) die(err);
        if (out) write_logits(s, out);
    }
    printf("\n");
}

static void store(ds4_engine *e, ds4_session *s, const char *dir) {
    ds4_kvstore kc;
    ds4_kvstore_options opt = ds4_kvstore_default_options();
    opt.min_tokens = 1;
    if (!ds4_kvstore_open(&kc, dir, DS4_KVSTORE_DEFAULT_MB, true, opt, "ds4ref", NULL, NULL))
        die("cannot open the kv directory");
    const ds4_tokens *live = ds4_session_tokens(s);
    ds4_tokens copy = {0};
    ds4_tokens_copy(&copy, live);
    char err[256] = {0};
    if (!ds4_kvstore_store_live_prefix(&kc, e, s, &copy, copy.len, "cold", NULL, err, sizeof(err)))
        die(err[0] ? err : "ds4 did not store the session");
    size_t text_len = 0;
    char *text = ds4_kvstore_render_tokens_text(e, &copy, &text_len);
    char sha[41];
    ds4_kvstore_sha1_bytes_hex(text, text_len, sha);
    char *path = ds4_kvstore_path_for_sha(&kc, sha);
    printf("saved: %s\n", path);
    free(path);
    free(text);
    ds4_tokens_free(&copy);
    ds4_kvstore_close(&kc);
}

static void resume(ds4_session *s, const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) die("cannot open the .kv file");
    ds4_kvstore_entry entry = {0};
    uint32_t text_bytes = 0;
    if (!ds4_kvstore_read_header(fp, &entry, &text_bytes)) die("not a ds4 .kv file");
    if (fseek(fp, (long)text_bytes, SEEK_CUR) != 0) die("cannot skip the text");
    char err[256] = {0};
    if (ds4_session_load_payload(s, fp, entry.payload_bytes, err, sizeof(err)) != 0) die(err);
    fclose(fp);
    printf("restored: %d tokens\n", ds4_session_pos(s));
}

int main(int argc, char **argv) {
    if (argc < 3) die("usage: ds4ref MODEL logits|save|resume [options] (see the source)");
    const char *model = argv[1], *cmd = argv[2];
    const char *out_path = NULL, *dir = NULL, *file = NULL;
    int ctx = 4096, threads = 2, steps = 0;
    ds4_tokens prompt = {0};
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) die("every option takes a value");
        const char *v = argv[++i];
        if (!strcmp(a, "--tokens")) parse_tokens(v, &prompt);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--dir")) dir = v;
        else if (!strcmp(a, "--file")) file = v;
        else if (!strcmp(a, "--ctx")) ctx = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else die("unknown option");
    }
    ds4_engine_options opt = {0};
    opt.model_path = model;
    opt.backend = DS4_BACKEND_CPU;
    opt.n_threads = threads;
    ds4_engine *e = NULL;
    if (ds4_engine_open(&e, &opt) != 0) die("ds4 could not open the model");
    ds4_session *s = NULL;
    if (ds4_session_create(&s, e, ctx) != 0) die("ds4 could not create a session");
    char err[256] = {0};
    FILE *out = out_path ? fopen(out_path, "wb") : NULL;
    if (out_path && !out) die("cannot create --out");

    if (!strcmp(cmd, "resume")) {
        if (!file) die("resume needs --file");
        resume(s, file);
    } else {
        if (prompt.len == 0) die("--tokens is required");
        if (ds4_session_sync(s, &prompt, err, sizeof(err)) != 0) die(err);
    }
    if (!strcmp(cmd, "logits") || !strcmp(cmd, "resume")) {
        if (!out) die("--out is required");
        write_logits(s, out);
        greedy(s, steps, out);
        if (dir) store(e, s, dir);
    } else if (!strcmp(cmd, "save")) {
        if (!dir) die("save needs --dir");
        store(e, s, dir);
    } else {
        die("unknown command");
    }
    if (out && fclose(out) != 0) die("cannot close --out");
    ds4_tokens_free(&prompt);
    ds4_session_free(s);
    ds4_engine_close(e);
    return 0;
}
