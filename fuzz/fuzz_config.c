/* libFuzzer: arbitrary bytes as config.json text. Parsing must not crash; an accepted
 * config must satisfy the invariants the rest of the engine relies on. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"
#include "io/quant_match.h"

/* What the quantized loaders rely on in an accepted quantization_config. */
static void check_quant(const qd_quant_config *q) {
    if (q->method == QD_QUANT_NONE) return;
    if (!memchr(q->method_name, '\0', sizeof q->method_name)) abort();
    if (q->block_rows < 0 || q->block_cols < 0 || q->block_rows > 65536 || q->block_cols > 65536) abort();
    if ((q->block_rows == 0) != (q->block_cols == 0)) abort();
    if (q->method == QD_QUANT_GPTQ || q->method == QD_QUANT_AWQ || q->method == QD_QUANT_CT_INT4) {
        if (q->bits != 4) abort();
        if (q->group_size != -1 && (q->group_size < 2 || q->group_size % 2)) abort();
        if (q->method == QD_QUANT_GPTQ && q->gptq_version != 1 && q->gptq_version != 2) abort();
    }
    if (q->method == QD_QUANT_CT_NVFP4 && q->group_size != 16) abort();
    /* the exclusion entries are NUL-terminated inside their buffer */
    size_t at = 0;
    for (int i = 0; i < q->n_excluded; i++) {
        const char *end = memchr(q->excluded + at, '\0', sizeof q->excluded - at);
        if (!end) abort();
        at = (size_t)(end - q->excluded) + 1;
    }
    at = 0;
    for (int i = 0; i < q->n_blocks; i++) {
        const char *end = memchr(q->blocks + at, '\0', sizeof q->blocks - at);
        if (!end) abort();
        at = (size_t)(end - q->blocks) + 1;
    }
    static const char *const names[] = {"model.layers.0.mlp.gate", "lm_head", "model.layers.3.linear_attn.in_proj_qkvz",
                                        "mtp.layers.0.mlp.experts.7.down_proj", ""};
    /* the parser checked every pattern as the matcher compiles it: only memory may fail */
    qd_quant_matcher *mt = NULL;
    qd_err err = {0};
    const qd_status s = qd_quant_matcher_create(q, &mt, &err);
    if (s != QD_OK && s != QD_ERR_OOM) abort();
    for (size_t i = 0; mt && i < sizeof names / sizeof *names; i++) (void)qd_quant_matcher_excluded(mt, names[i]);
    qd_quant_matcher_free(mt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    qd_config c;
    qd_err err = {0};
    if (qd_config_parse(buf, size, "fuzz.json", &c, &err) == QD_OK) {
        if (c.n_layers <= 0 || c.n_layers > QD_MAX_LAYERS) abort();
        if (c.gdn_hk <= 0 || c.gdn_hv % c.gdn_hk != 0 || c.attn_nq % c.attn_nkv != 0) abort();
        if (c.rope_dim <= 0 || c.rope_dim % 2 || c.rope_dim > c.attn_head_dim) abort();
        if (qd_config_n_gdn_layers(&c) + qd_config_n_attn_layers(&c) != c.n_layers) abort();
        if (qd_config_conv_dim(&c) <= 0 || c.n_eos < 0 || c.n_eos > QD_MAX_EOS) abort();
        for (int i = 0; i < c.n_layers; i++)
            if (c.ffn_kind[i] == QD_FFN_MOE && (c.n_experts <= 0 || c.n_experts_per_tok > c.n_experts)) abort();
        check_quant(&c.quant);
    } else if (err.msg[0] == '\0' || !strstr(err.msg, "fuzz.json")) {
        abort();
    }
    free(buf);
    return 0;
}
