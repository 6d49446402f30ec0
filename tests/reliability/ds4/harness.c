/* A driver for antirez/ds4's own disk store (ds4_kvstore.c, built unmodified beside this
 * file), so tests can run ds4's writer, lookup, hit and eviction against a ds4tui cache
 * directory. ds4's engine is replaced by the least that ds4_kvstore.c calls: a token is one
 * byte of text, and a payload is the token count then the tokens (u32 each).
 *
 *   harness DIR list             the files ds4 sees (its kv_cache_refresh, via evict with no budget pressure)
 *   harness DIR store TEXT       store a checkpoint of TEXT ("cold"), as ds4-server does
 *   harness DIR evict BYTES      ds4's budget pass down to BYTES
 *   harness DIR load PROMPT      ds4's lookup + load + hit for PROMPT; prints the tokens loaded
 *
 * Build: scripts/build_ds4_harness.sh DS4_SOURCE_DIR OUT (under /tmp; never in the repo). */
#include "ds4_kvstore.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ds4_engine { int quant_bits; };
struct ds4_session { ds4_tokens tokens; int ctx; };

void ds4_tokens_push(ds4_tokens *tv, int token) {
    if (tv->len == tv->cap) {
        tv->cap = tv->cap ? tv->cap * 2 : 64;
        tv->v = realloc(tv->v, (size_t)tv->cap * sizeof(int));
        if (!tv->v) exit(2);
    }
    tv->v[tv->len++] = token;
}
void ds4_tokens_free(ds4_tokens *tv) { free(tv->v); memset(tv, 0, sizeof(*tv)); }
void ds4_tokens_copy(ds4_tokens *dst, const ds4_tokens *src) {
    dst->len = 0;
    for (int i = 0; src && i < src->len; i++) ds4_tokens_push(dst, src->v[i]);
}
bool ds4_tokens_starts_with(const ds4_tokens *t, const ds4_tokens *p) {
    if (p->len > t->len) return false;
    return p->len == 0 || memcmp(t->v, p->v, (size_t)p->len * sizeof(int)) == 0;
}
static void bytes_to_tokens(const char *text, ds4_tokens *out) {
    out->len = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) ds4_tokens_push(out, *p);
}
void ds4_tokenize_rendered_chat(ds4_engine *e, const char *text, ds4_tokens *out) {
    (void)e;
    bytes_to_tokens(text, out);
}
char *ds4_token_text(ds4_engine *e, int token, size_t *len) {
    (void)e;
    char *s = malloc(2);
    s[0] = (char)token;
    s[1] = 0;
    *len = 1;
    return s;
}
void ds4_session_invalidate(ds4_session *s) { s->tokens.len = 0; }
int ds4_session_ctx(ds4_session *s) { return s->ctx; }
int ds4_engine_routed_quant_bits(ds4_engine *e) { return e->quant_bits; }
const ds4_tokens *ds4_session_tokens(ds4_session *s) { return &s->tokens; }
uint64_t ds4_session_payload_bytes(ds4_session *s) { return 4u + 4u * (uint64_t)s->tokens.len; }
int ds4_session_save_payload(ds4_session *s, FILE *fp, char *err, size_t errlen) {
    (void)err; (void)errlen;
    uint32_t n = (uint32_t)s->tokens.len;
    if (fwrite(&n, 4, 1, fp) != 1) return -1;
    for (int i = 0; i < s->tokens.len; i++) {
        uint32_t t = (uint32_t)s->tokens.v[i];
        if (fwrite(&t, 4, 1, fp) != 1) return -1;
    }
    return 0;
}
int ds4_session_load_payload(ds4_session *s, FILE *fp, uint64_t payload_bytes, char *err, size_t errlen) {
    uint32_t n;
    if (payload_bytes < 4 || fread(&n, 4, 1, fp) != 1 || payload_bytes != 4u + 4u * (uint64_t)n) {
        snprintf(err, errlen, "not a harness payload");
        return -1;
    }
    s->tokens.len = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t t;
        if (fread(&t, 4, 1, fp) != 1) return -1;
        ds4_tokens_push(&s->tokens, (int)t);
    }
    return 0;
}

static void log_line(void *ud, ds4_kvstore_log_type type, const char *msg) {
    (void)ud; (void)type;
    fprintf(stderr, "%s\n", msg);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    ds4_kvstore kc;
    ds4_kvstore_options opt = ds4_kvstore_default_options();
    opt.min_tokens = 1;  /* the tests' texts are short */
    if (!ds4_kvstore_open(&kc, argv[1], 1u << 20, false, opt, "harness", log_line, NULL)) return 3;
    ds4_engine engine = { 4 };
    ds4_session session = { {0}, 4096 };
    const char *cmd = argv[2];
    if (!strcmp(cmd, "list")) {
        ds4_kvstore_evict(&kc, NULL, NULL);  /* refreshes the list; the 1 TiB budget evicts nothing */
        for (int i = 0; i < kc.len; i++) printf("%s\n", kc.entry[i].sha);
    } else if (!strcmp(cmd, "store") && argc > 3) {
        bytes_to_tokens(argv[3], &session.tokens);
        ds4_tokens toks = {0};
        ds4_tokens_copy(&toks, &session.tokens);
        char err[160] = {0};
        if (!ds4_kvstore_store_live_prefix(&kc, &engine, &session, &toks, toks.len, "cold", NULL, err, sizeof(err)))
            return 4;
        char sha[41];
        ds4_kvstore_sha1_bytes_hex(argv[3], strlen(argv[3]), sha);
        printf("%s\n", sha);
    } else if (!strcmp(cmd, "evict") && argc > 3) {
        kc.budget_bytes = strtoull(argv[3], NULL, 10);
        if (kc.budget_bytes == 0) kc.budget_bytes = 1;  /* 0 means "no budget" to ds4 */
        ds4_kvstore_evict(&kc, NULL, NULL);
    } else if (!strcmp(cmd, "load") && argc > 3) {
        ds4_tokens effective = {0};
        ds4_kvstore_load_result res;
        printf("%d\n", ds4_kvstore_try_load_text(&kc, &engine, &session, argv[3], &effective, &res, NULL, false));
    } else {
        return 2;
    }
    ds4_kvstore_close(&kc);
    return 0;
}
