/* llama.cpp's greedy tokens and logits on given token ids: the harness of
 * test_llama_cpp_converter.py, compiled there against llama.cpp's llama.h and libllama.
 *
 * Usage: llama_cpp_greedy MODEL.gguf N_PREDICT ID...
 * Decodes the ids as one batch, then N_PREDICT greedy steps, one token each; prints one line
 * per step: the chosen id, then the logits of every vocabulary entry. One CPU thread, an
 * f32 KV cache (the test's ds4tui sessions use f32 too), the whole context as SWA cache.
 */
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *data) {
    (void)data;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL N_PREDICT ID...\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const int n_predict = atoi(argv[2]);
    const int n_prompt = argc - 3;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_prompt + n_predict + 8);
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.swa_full = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_token *ids = malloc(sizeof(llama_token) * (size_t)n_prompt);
    for (int i = 0; i < n_prompt; i++) ids[i] = (llama_token)atoi(argv[3 + i]);
    if (llama_decode(ctx, llama_batch_get_one(ids, n_prompt))) return 1;
    for (int step = 0; step < n_predict; step++) {
        const float *logits = llama_get_logits_ith(ctx, -1);
        llama_token best = 0;
        for (int v = 1; v < n_vocab; v++) if (logits[v] > logits[best]) best = v;
        printf("%d", best);
        for (int v = 0; v < n_vocab; v++) printf(" %.9g", logits[v]);
        printf("\n");
        if (step + 1 < n_predict && llama_decode(ctx, llama_batch_get_one(&best, 1))) return 1;
    }
    free(ids);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
