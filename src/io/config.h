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

/* The checkpoint's quantization scheme (config.json quantization_config, or ModelOpt's
 * hf_quant_config.json; config_quant.c). It says what the tensors are expected to be; the
 * loader (src/model/model_quant*.c) still decides per module from the tensors present and
 * fails where they and this disagree. */
typedef enum qd_quant_method {
    QD_QUANT_NONE = 0,
    QD_QUANT_FP8,          /* quant_method fp8: e4m3 weight + weight_scale_inv (block) or weight_scale */
    QD_QUANT_CT_FP8,       /* compressed-tensors float-quantized: weight + weight_scale */
    QD_QUANT_CT_NVFP4,     /* compressed-tensors nvfp4-pack-quantized: weight_packed + scales */
    QD_QUANT_CT_INT4,      /* compressed-tensors pack-quantized int4: weight_packed + scales (+ zero points) */
    QD_QUANT_MODELOPT,     /* ModelOpt NVFP4 (weight U8, weight_scale e4m3, weight_scale_2) or FP8 */
    QD_QUANT_GPTQ,         /* qweight / qzeros / scales / g_idx, packed along the input dim */
    QD_QUANT_AWQ           /* qweight / qzeros / scales, GEMM packing along the output dim */
} qd_quant_method;

/* How the entries of an exclusion list match a module name (HF's modules_to_not_convert
 * are substrings; compressed-tensors' ignore entries are names or "re:" regexes matched
 * from the start; ModelOpt's exclude_modules are wildcards; every kind takes "re:"). */
typedef enum qd_quant_match { QD_QUANT_MATCH_SUBSTRING = 0, QD_QUANT_MATCH_NAME, QD_QUANT_MATCH_WILDCARD } qd_quant_match;

#define QD_QUANT_EXCLUDE_BYTES 32768
#define QD_QUANT_BLOCK_BYTES 512

typedef struct qd_quant_config {
    qd_quant_method method;
    char method_name[48];     /* as written (quant_method / format / quant_algo) for messages */
    int block_rows, block_cols; /* FP8 weight_block_size / block_structure; 0: per-channel or per-tensor */
    int bits;                 /* GPTQ / AWQ / compressed-tensors int: 4 */
    int group_size;           /* GPTQ / AWQ / NVFP4 / int group; -1: one group per row */
    bool sym;                 /* GPTQ sym / AWQ !zero_point / compressed-tensors symmetric */
    bool desc_act;            /* GPTQ act-order, compressed-tensors actorder group (g_idx) */
    int gptq_version;         /* 1 (checkpoint_format gptq: stored zeros are z - 1) or 2 (exact) */
    bool has_exclusions;      /* the config names the modules left unquantized */
    qd_quant_match match;
    int n_excluded;
    char excluded[QD_QUANT_EXCLUDE_BYTES]; /* the entries, each NUL-terminated, back to back; matched
                                            * through io/quant_match.h, which compiles them once */
    int n_blocks;             /* AutoRound's block_name_to_quantize: modules outside every one are not converted */
    char blocks[QD_QUANT_BLOCK_BYTES]; /* the name prefixes, each NUL-terminated, back to back */
} qd_quant_config;

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
    int mtp_layers;             /* mtp_num_hidden_layers (0 when absent): what a dummy model draws;
                                 * a checkpoint's head is bound from its mtp.* tensors */
    qd_quant_config quant;      /* QD_QUANT_NONE for plain checkpoints */

    int bos_token_id;           /* -1 if absent */
    int eos_token_ids[QD_MAX_EOS];
    int n_eos;
} qd_config;

/* Parses config.json text. `what` names the source in error messages. */
qd_status qd_config_parse(const char *json_text, size_t len, const char *what, qd_config *out, qd_err *err);
/* Reads and parses DIR/config.json. */
qd_status qd_config_load(const char *dir, qd_config *out, qd_err *err);

/* The quantization_config object of a config (NULL: none), or ModelOpt's hf_quant_config.json
 * object; `what` names the source. Unknown methods, formats, bit widths or layouts fail naming
 * the field and value. */
struct json_t;
qd_status qd_quant_config_parse(const struct json_t *qc, const char *what, bool modelopt_file, qd_quant_config *out,
                                qd_err *err);

int qd_config_n_gdn_layers(const qd_config *c);
int qd_config_n_attn_layers(const qd_config *c);
static inline int qd_config_key_dim(const qd_config *c) { return c->gdn_hk * c->gdn_dk; }
static inline int qd_config_value_dim(const qd_config *c) { return c->gdn_hv * c->gdn_dv; }
static inline int qd_config_conv_dim(const qd_config *c) { return 2 * c->gdn_hk * c->gdn_dk + c->gdn_hv * c->gdn_dv; }

#endif
