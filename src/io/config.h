/* Model configuration read from a checkpoint's config.json.
 *
 * Accepts `qwen3_next` (flat), `qwen3_5` / `qwen3_5_moe` (composite: fields under
 * `text_config`) and the flat text exports `qwen3_5_text` / `qwen3_5_moe_text`.
 * Every derived quantity the engine needs (layer plan, head groupings, dims) is
 * computed here once, so the rest of the engine never looks at JSON. */
#ifndef QD_IO_CONFIG_H
#define QD_IO_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

#define QD_MAX_LAYERS 256
#define QD_MAX_EOS 8

typedef enum qd_arch {
    QD_ARCH_QWEN3_NEXT = 0,  /* interleaved in_proj_qkvz / in_proj_ba, model.layers.* */
    QD_ARCH_QWEN3_5 = 1,     /* dense FFN, separate in_proj_{qkv,z,a,b} */
    QD_ARCH_QWEN3_5_MOE = 2  /* MoE FFN, separate in_proj_{qkv,z,a,b} */
} qd_arch;

typedef enum qd_layer_kind { QD_LAYER_GDN = 0, QD_LAYER_ATTN = 1 } qd_layer_kind;
typedef enum qd_ffn_kind { QD_FFN_DENSE = 0, QD_FFN_MOE = 1 } qd_ffn_kind;

typedef struct qd_config {
    qd_arch arch;
    char model_type[32];        /* as written in config.json (top level) */

    int hidden_size;            /* H */
    int n_layers;
    int vocab_size;
    float rms_norm_eps;
    bool tie_word_embeddings;

    /* per-layer plan */
    qd_layer_kind layer_kind[QD_MAX_LAYERS];
    qd_ffn_kind ffn_kind[QD_MAX_LAYERS];

    /* Gated DeltaNet (linear attention) */
    int gdn_hk;                 /* linear_num_key_heads */
    int gdn_hv;                 /* linear_num_value_heads (multiple of hk) */
    int gdn_dk;                 /* linear_key_head_dim */
    int gdn_dv;                 /* linear_value_head_dim */
    int gdn_conv_kernel;        /* linear_conv_kernel_dim (4) */

    /* Gated full attention */
    int attn_nq;                /* num_attention_heads */
    int attn_nkv;               /* num_key_value_heads */
    int attn_head_dim;          /* head_dim (not H/NQ) */
    int rope_dim;               /* head_dim * partial_rotary_factor, even */
    double rope_theta;
    bool attn_output_gate;      /* q_proj carries a sigmoid gate per head */

    /* FFN */
    int intermediate_size;      /* dense SwiGLU width */
    int n_experts;              /* 0 for dense models */
    int n_experts_per_tok;
    int moe_intermediate_size;
    int shared_expert_intermediate_size; /* 0 = no shared expert */
    bool norm_topk_prob;        /* renormalise top-k weights */

    int max_position_embeddings;
    int bos_token_id;           /* -1 if absent */
    int eos_token_ids[QD_MAX_EOS];
    int n_eos;
} qd_config;

/* Parses config.json text. `what` names the source in error messages. */
qd_status qd_config_parse(const char *json_text, size_t len, const char *what, qd_config *out, qd_err *err);
/* Reads and parses DIR/config.json. */
qd_status qd_config_load(const char *dir, qd_config *out, qd_err *err);

int qd_config_n_gdn_layers(const qd_config *c);
int qd_config_n_attn_layers(const qd_config *c);
static inline int qd_config_key_dim(const qd_config *c) { return c->gdn_hk * c->gdn_dk; }
static inline int qd_config_value_dim(const qd_config *c) { return c->gdn_hv * c->gdn_dv; }
static inline int qd_config_conv_dim(const qd_config *c) { return 2 * c->gdn_hk * c->gdn_dk + c->gdn_hv * c->gdn_dv; }

#endif
