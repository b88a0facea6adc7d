/* libFuzzer: arbitrary bytes as config.json text. Parsing must not crash; an accepted
 * config must satisfy the invariants the rest of the engine relies on. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"

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
    } else if (err.msg[0] == '\0' || !strstr(err.msg, "fuzz.json")) {
        abort();
    }
    free(buf);
    return 0;
}
