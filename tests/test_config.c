/* config.json parsing: the five accepted model types (flat and composite layouts,
 * modelled on the released configs), defaults, the layer/FFN plan rules, and every
 * rejection (missing field, wrong type, inconsistent dims, unknown model_type).
 * JSON is written with single quotes for readability and converted before parsing. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkdtemp */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/config.h"
#include "qd_test.h"

/* Single quotes -> double quotes; then optionally replace the first `from` with `to`. */
static char *J(const char *s, const char *from, const char *to) {
    size_t n = strlen(s);
    size_t extra = to ? strlen(to) : 0;
    char *out = malloc(n + extra + 1);
    const char *hit = from ? strstr(s, from) : NULL;
    if (from && !hit) {
        fprintf(stderr, "test bug: '%s' not in base config\n", from);
        exit(1);
    }
    size_t k = 0;
    for (const char *p = s; *p;) {
        if (p == hit) {
            for (const char *q = to; *q; q++) out[k++] = *q == '\'' ? '"' : *q;
            p += strlen(from);
            continue;
        }
        out[k++] = *p == '\'' ? '"' : *p;
        p++;
    }
    out[k] = 0;
    return out;
}

static qd_status parse(const char *base, const char *from, const char *to, qd_config *c, qd_err *e) {
    char *s = J(base, from, to);
    e->msg[0] = 0;
    qd_status st = qd_config_parse(s, strlen(s), "cfg.json", c, e);
    free(s);
    return st;
}

#define EXPECT_FAIL(base, from, to, status, n1)                                                      \
    do {                                                                                             \
        qd_config c_;                                                                                \
        qd_err e_;                                                                                   \
        qd_status s_ = parse(base, from, to, &c_, &e_);                                              \
        CHECKF(s_ == (status), "%s -> %s: got %s: %s", (const char *)(from ? from : "-"),            \
               (const char *)(to ? to : "-"), qd_status_name(s_), e_.msg);                             \
        CHECKF(strstr(e_.msg, "cfg.json") != NULL, "file not named: %s", e_.msg);                    \
        CHECKF(strstr(e_.msg, n1) != NULL, "'%s' not in message: %s", n1, e_.msg);                   \
    } while (0)

/* Qwen3-Next-80B-A3B-Instruct (flat; no layer_types: interval 4). */
static const char *k_next =
    "{'architectures':['Qwen3NextForCausalLM'],'model_type':'qwen3_next','attention_bias':false,"
    "'attention_dropout':0.0,'bos_token_id':151643,'decoder_sparse_step':1,'eos_token_id':151645,"
    "'full_attention_interval':4,'head_dim':256,'hidden_act':'silu','hidden_size':2048,"
    "'initializer_range':0.02,'intermediate_size':5120,'linear_conv_kernel_dim':4,'linear_key_head_dim':128,"
    "'linear_num_key_heads':16,'linear_num_value_heads':32,'linear_value_head_dim':128,"
    "'max_position_embeddings':262144,'mlp_only_layers':[],'moe_intermediate_size':512,'norm_topk_prob':true,"
    "'num_attention_heads':16,'num_experts':512,'num_experts_per_tok':10,'num_hidden_layers':48,"
    "'num_key_value_heads':2,'output_router_logits':false,'partial_rotary_factor':0.25,'rms_norm_eps':1e-06,"
    "'rope_scaling':null,'rope_theta':10000000,'router_aux_loss_coef':0.001,"
    "'shared_expert_intermediate_size':512,'tie_word_embeddings':false,'torch_dtype':'bfloat16',"
    "'use_cache':true,'use_sliding_window':false,'vocab_size':151936}";

/* A small Qwen3-Next with layer_types, mlp_only_layers and decoder_sparse_step 2. */
static const char *k_next_small =
    "{'model_type':'qwen3_next','hidden_size':64,'num_hidden_layers':8,'vocab_size':1000,"
    "'layer_types':['linear_attention','linear_attention','full_attention','linear_attention',"
    "'linear_attention','full_attention','linear_attention','full_attention'],"
    "'linear_num_key_heads':2,'linear_num_value_heads':4,'linear_key_head_dim':16,'linear_value_head_dim':8,"
    "'linear_conv_kernel_dim':4,'num_attention_heads':4,'num_key_value_heads':2,"
    "'intermediate_size':96,'num_experts':8,'num_experts_per_tok':2,'moe_intermediate_size':32,"
    "'decoder_sparse_step':2,'mlp_only_layers':[0,5],'norm_topk_prob':false,'rms_norm_eps':1e-05}";

/* Qwen3.5-0.8B: composite with text_config, vision_config, rope_parameters. */
static const char *k_35 =
    "{'architectures':['Qwen3_5ForConditionalGeneration'],'model_type':'qwen3_5',"
    "'image_token_id':248056,'tie_word_embeddings':true,"
    "'text_config':{'model_type':'qwen3_5_text','attention_bias':false,'attn_output_gate':true,"
    "'bos_token_id':null,'eos_token_id':248044,'full_attention_interval':4,'head_dim':256,"
    "'hidden_act':'silu','hidden_size':1024,'intermediate_size':3584,"
    "'layer_types':['linear_attention','linear_attention','linear_attention','full_attention',"
    "'linear_attention','linear_attention','linear_attention','full_attention'],"
    "'linear_conv_kernel_dim':4,'linear_key_head_dim':128,'linear_num_key_heads':16,"
    "'linear_num_value_heads':16,'linear_value_head_dim':128,'mamba_ssm_dtype':'float32',"
    "'max_position_embeddings':262144,'mtp_num_hidden_layers':1,'mtp_use_dedicated_embeddings':false,"
    "'num_attention_heads':8,'num_hidden_layers':8,'num_key_value_heads':2,'output_gate_type':'swish',"
    "'rms_norm_eps':1e-06,'rope_parameters':{'mrope_interleaved':true,'mrope_section':[11,11,10],"
    "'rope_type':'default','rope_theta':10000000,'partial_rotary_factor':0.25},'vocab_size':248320},"
    "'vision_config':{'model_type':'qwen3_5_vision','depth':12,'hidden_size':768,'num_heads':12},"
    "'vision_start_token_id':248053}";

/* Qwen3.5-35B-A3B: composite MoE, no layer_types (interval rule). */
static const char *k_35moe =
    "{'architectures':['Qwen3_5MoeForConditionalGeneration'],'model_type':'qwen3_5_moe',"
    "'text_config':{'model_type':'qwen3_5_moe_text','hidden_size':2048,'num_hidden_layers':40,"
    "'vocab_size':248320,'linear_num_key_heads':16,'linear_num_value_heads':32,'linear_key_head_dim':128,"
    "'linear_value_head_dim':128,'linear_conv_kernel_dim':4,'num_attention_heads':16,'num_key_value_heads':2,"
    "'head_dim':256,'num_experts':256,'num_experts_per_tok':8,'moe_intermediate_size':512,"
    "'shared_expert_intermediate_size':512,'full_attention_interval':4,'eos_token_id':248044,"
    "'rope_parameters':{'rope_type':'default','rope_theta':10000000,'partial_rotary_factor':0.25}},"
    "'vision_config':{'depth':27},'tie_word_embeddings':false}";

/* Flat third-party text exports. */
static const char *k_35text =
    "{'model_type':'qwen3_5_text','hidden_size':128,'num_hidden_layers':4,'vocab_size':512,"
    "'intermediate_size':256,'linear_num_key_heads':2,'linear_num_value_heads':6,'linear_key_head_dim':32,"
    "'linear_value_head_dim':32,'linear_conv_kernel_dim':4,'num_attention_heads':4,'num_key_value_heads':1,"
    "'head_dim':64,'rope_theta':1000000.0,'partial_rotary_factor':0.5,'rope_scaling':null,"
    "'eos_token_id':[7,9],'bos_token_id':1,'tie_word_embeddings':true,'attn_output_gate':false}";

static const char *k_35moetext =
    "{'model_type':'qwen3_5_moe_text','hidden_size':128,'num_hidden_layers':4,'vocab_size':512,"
    "'linear_num_key_heads':2,'linear_num_value_heads':4,'linear_key_head_dim':32,"
    "'linear_value_head_dim':32,'linear_conv_kernel_dim':4,'num_attention_heads':4,'num_key_value_heads':2,"
    "'num_experts':16,'num_experts_per_tok':4,'moe_intermediate_size':64,'norm_topk_prob':false}";

static void test_qwen3_next(void) {
    qd_config c;
    qd_err e;
    qd_status s = parse(k_next, NULL, NULL, &c, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    CHECK(c.arch == QD_ARCH_QWEN3_NEXT && strcmp(c.model_type, "qwen3_next") == 0);
    CHECK(c.hidden_size == 2048 && c.n_layers == 48 && c.vocab_size == 151936);
    CHECK(qd_config_n_gdn_layers(&c) == 36 && qd_config_n_attn_layers(&c) == 12);
    CHECK(c.layer_kind[0] == QD_LAYER_GDN && c.layer_kind[3] == QD_LAYER_ATTN && c.layer_kind[47] == QD_LAYER_ATTN);
    int n_moe = 0;
    for (int i = 0; i < 48; i++) n_moe += c.ffn_kind[i] == QD_FFN_MOE;
    CHECK(n_moe == 48);
    CHECK(c.gdn_hk == 16 && c.gdn_hv == 32 && c.gdn_dk == 128 && c.gdn_dv == 128 && c.gdn_conv_kernel == 4);
    CHECK(qd_config_key_dim(&c) == 2048 && qd_config_value_dim(&c) == 4096 && qd_config_conv_dim(&c) == 8192);
    CHECK(c.attn_nq == 16 && c.attn_nkv == 2 && c.attn_head_dim == 256 && c.rope_dim == 64);
    CHECK(c.rope_theta == 1e7 && c.attn_output_gate && !c.tie_word_embeddings);
    CHECK(c.n_experts == 512 && c.n_experts_per_tok == 10 && c.moe_intermediate_size == 512);
    CHECK(c.shared_expert_intermediate_size == 512 && c.norm_topk_prob && c.intermediate_size == 5120);
    CHECK(c.max_position_embeddings == 262144 && c.bos_token_id == 151643);
    CHECK(c.n_eos == 1 && c.eos_token_ids[0] == 151645);
    CHECK(fabsf(c.rms_norm_eps - 1e-6f) < 1e-12f);

    /* mlp_only_layers + decoder_sparse_step 2 + explicit layer_types */
    s = parse(k_next_small, NULL, NULL, &c, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    const int want_moe[8] = {0, 1, 0, 1, 0, 0, 0, 1}; /* (i+1)%2==0, minus layers 0 and 5 */
    int ok = 1;
    for (int i = 0; i < 8; i++) ok &= (c.ffn_kind[i] == QD_FFN_MOE) == want_moe[i];
    CHECK(ok);
    CHECK(c.layer_kind[2] == QD_LAYER_ATTN && c.layer_kind[3] == QD_LAYER_GDN && c.layer_kind[7] == QD_LAYER_ATTN);
    CHECK(qd_config_n_attn_layers(&c) == 3);
    CHECK(!c.norm_topk_prob && c.intermediate_size == 96 && c.shared_expert_intermediate_size == 0);
    /* defaults: head_dim 256 (transformers' default, not H/NQ), rope 10000 / 0.25, no bos/eos, untied, gate on */
    CHECK(c.attn_head_dim == 256 && c.rope_dim == 64 && c.rope_theta == 10000.0);
    CHECK(c.bos_token_id == -1 && c.n_eos == 0 && !c.tie_word_embeddings && c.attn_output_gate);
    CHECK(fabsf(c.rms_norm_eps - 1e-5f) < 1e-12f);

    /* num_experts 0 -> all dense */
    s = parse(k_next_small, "'num_experts':8", "'num_experts':0", &c, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    CHECK(c.n_experts == 0 && c.ffn_kind[1] == QD_FFN_DENSE && c.ffn_kind[7] == QD_FFN_DENSE);
    /* integral reals are accepted as integers */
    s = parse(k_next, "'hidden_size':2048", "'hidden_size':2048.0", &c, &e);
    CHECKF(s == QD_OK && c.hidden_size == 2048, "%s", e.msg);
}

static void test_qwen3_5(void) {
    qd_config c;
    qd_err e;
    qd_status s = parse(k_35, NULL, NULL, &c, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    CHECK(c.arch == QD_ARCH_QWEN3_5 && strcmp(c.model_type, "qwen3_5") == 0);
    CHECK(c.hidden_size == 1024 && c.n_layers == 8 && c.vocab_size == 248320 && c.intermediate_size == 3584);
    CHECK(c.tie_word_embeddings); /* top level, absent from text_config */
    CHECK(c.rope_theta == 1e7 && c.rope_dim == 64 && c.attn_head_dim == 256);
    CHECK(c.n_experts == 0 && c.ffn_kind[0] == QD_FFN_DENSE && c.ffn_kind[7] == QD_FFN_DENSE);
    CHECK(qd_config_n_attn_layers(&c) == 2 && c.layer_kind[3] == QD_LAYER_ATTN);
    CHECK(c.n_eos == 1 && c.eos_token_ids[0] == 248044 && c.bos_token_id == -1);
    /* text_config value wins over the top level */
    s = parse(k_35, "'mamba_ssm_dtype'", "'tie_word_embeddings':false,'mamba_ssm_dtype'", &c, &e);
    CHECKF(s == QD_OK && !c.tie_word_embeddings, "%s", e.msg);
    /* text_config.model_type says MoE: trust it */
    s = parse(k_35moe, "'model_type':'qwen3_5_moe',", "'model_type':'qwen3_5',", &c, &e);
    CHECKF(s == QD_OK && c.arch == QD_ARCH_QWEN3_5_MOE, "%s", e.msg);

    s = parse(k_35moe, NULL, NULL, &c, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    CHECK(c.arch == QD_ARCH_QWEN3_5_MOE && c.n_layers == 40);
    CHECK(qd_config_n_gdn_layers(&c) == 30 && c.layer_kind[39] == QD_LAYER_ATTN);
    int all_moe = 1;
    for (int i = 0; i < 40; i++) all_moe &= c.ffn_kind[i] == QD_FFN_MOE;
    CHECK(all_moe && c.n_experts == 256 && c.n_experts_per_tok == 8 && c.shared_expert_intermediate_size == 512);
    CHECK(c.norm_topk_prob && c.intermediate_size == 0 && !c.tie_word_embeddings);

    s = parse(k_35text, NULL, NULL, &c, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    CHECK(c.arch == QD_ARCH_QWEN3_5 && strcmp(c.model_type, "qwen3_5_text") == 0);
    CHECK(c.rope_theta == 1e6 && c.rope_dim == 32 && c.gdn_hv == 6 && !c.attn_output_gate);
    CHECK(c.n_eos == 2 && c.eos_token_ids[0] == 7 && c.eos_token_ids[1] == 9 && c.bos_token_id == 1);
    CHECK(c.tie_word_embeddings && c.layer_kind[3] == QD_LAYER_ATTN && c.layer_kind[2] == QD_LAYER_GDN);
    CHECK(c.max_position_embeddings > 0 && fabsf(c.rms_norm_eps - 1e-6f) < 1e-12f);

    s = parse(k_35moetext, NULL, NULL, &c, &e);
    CHECKF(s == QD_OK, "%s", e.msg);
    CHECK(c.arch == QD_ARCH_QWEN3_5_MOE && c.ffn_kind[0] == QD_FFN_MOE && c.norm_topk_prob);
    CHECK(c.attn_head_dim == 256 && c.rope_dim == 64);  /* no head_dim: transformers' 256 */
    /* composite name with a flat layout (no text_config) */
    s = parse(k_35moetext, "'qwen3_5_moe_text'", "'qwen3_5_moe'", &c, &e);
    CHECKF(s == QD_OK && c.arch == QD_ARCH_QWEN3_5_MOE, "%s", e.msg);
}

static void test_errors(void) {
    EXPECT_FAIL(k_next, "'qwen3_next'", "'llama'", QD_ERR_UNSUPPORTED, "llama");
    EXPECT_FAIL(k_next, "'qwen3_next'", "'llama'", QD_ERR_UNSUPPORTED, "qwen3_next, qwen3_5, qwen3_5_moe");
    EXPECT_FAIL(k_35, "'qwen3_5_text'", "'qwen3_vl_text'", QD_ERR_UNSUPPORTED, "qwen3_vl_text");
    EXPECT_FAIL(k_next, "'model_type':'qwen3_next',", "", QD_ERR_NOT_FOUND, "model_type");
    EXPECT_FAIL(k_next, "'model_type':'qwen3_next'", "'model_type':3", QD_ERR_FORMAT, "model_type");
    EXPECT_FAIL(k_next, "'hidden_size':2048,", "", QD_ERR_NOT_FOUND, "hidden_size");
    EXPECT_FAIL(k_35, "'hidden_size':1024,", "", QD_ERR_NOT_FOUND, "hidden_size");
    EXPECT_FAIL(k_next, "'vocab_size':151936", "'vocab_size':null", QD_ERR_NOT_FOUND, "vocab_size");
    EXPECT_FAIL(k_next, "'num_hidden_layers':48,", "", QD_ERR_NOT_FOUND, "num_hidden_layers");
    EXPECT_FAIL(k_next, "'num_key_value_heads':2,", "", QD_ERR_NOT_FOUND, "num_key_value_heads");
    EXPECT_FAIL(k_next, "'linear_key_head_dim':128,", "", QD_ERR_NOT_FOUND, "linear_key_head_dim");
    EXPECT_FAIL(k_35, "'intermediate_size':3584,", "", QD_ERR_NOT_FOUND, "intermediate_size");
    EXPECT_FAIL(k_next_small, "'intermediate_size':96,", "", QD_ERR_NOT_FOUND, "intermediate_size");
    EXPECT_FAIL(k_next, "'num_experts':512,", "", QD_ERR_NOT_FOUND, "num_experts");
    EXPECT_FAIL(k_35moe, "'num_experts_per_tok':8,", "", QD_ERR_NOT_FOUND, "num_experts_per_tok");
    EXPECT_FAIL(k_35moetext, "'moe_intermediate_size':64,", "", QD_ERR_NOT_FOUND, "moe_intermediate_size");
    /* wrong types */
    EXPECT_FAIL(k_next, "'hidden_size':2048", "'hidden_size':'2048'", QD_ERR_FORMAT, "hidden_size");
    EXPECT_FAIL(k_next, "'hidden_size':2048", "'hidden_size':'2048'", QD_ERR_FORMAT, "integer");
    EXPECT_FAIL(k_next, "'hidden_size':2048", "'hidden_size':2048.5", QD_ERR_FORMAT, "hidden_size");
    EXPECT_FAIL(k_next, "'hidden_size':2048", "'hidden_size':true", QD_ERR_FORMAT, "hidden_size");
    EXPECT_FAIL(k_next, "'hidden_size':2048", "'hidden_size':1e300", QD_ERR_FORMAT, "hidden_size");
    EXPECT_FAIL(k_35, "'hidden_size':1024", "'hidden_size':[1024]", QD_ERR_FORMAT, "text_config.hidden_size");
    EXPECT_FAIL(k_next, "'norm_topk_prob':true", "'norm_topk_prob':1", QD_ERR_FORMAT, "norm_topk_prob");
    EXPECT_FAIL(k_next, "'tie_word_embeddings':false", "'tie_word_embeddings':'no'", QD_ERR_FORMAT,
                "tie_word_embeddings");
    EXPECT_FAIL(k_35, "'attn_output_gate':true", "'attn_output_gate':'yes'", QD_ERR_FORMAT, "attn_output_gate");
    EXPECT_FAIL(k_next, "'rms_norm_eps':1e-06", "'rms_norm_eps':'1e-6'", QD_ERR_FORMAT, "rms_norm_eps");
    EXPECT_FAIL(k_next, "'rope_theta':10000000", "'rope_theta':'1e7'", QD_ERR_FORMAT, "rope_theta");
    EXPECT_FAIL(k_next, "'eos_token_id':151645", "'eos_token_id':'x'", QD_ERR_FORMAT, "eos_token_id");
    EXPECT_FAIL(k_next, "'eos_token_id':151645", "'eos_token_id':[1,2,3,4,5,6,7,8,9]", QD_ERR_UNSUPPORTED,
                "eos_token_id");
    EXPECT_FAIL(k_next, "'mlp_only_layers':[]", "'mlp_only_layers':{}", QD_ERR_FORMAT, "mlp_only_layers");
    EXPECT_FAIL(k_next, "'mlp_only_layers':[]", "'mlp_only_layers':['a']", QD_ERR_FORMAT, "mlp_only_layers");
    EXPECT_FAIL(k_35, "'text_config':{", "'text_config':[],'x':{", QD_ERR_FORMAT, "text_config");
    EXPECT_FAIL(k_35, "'rope_parameters':{", "'rope_parameters':5,'x':{", QD_ERR_FORMAT, "rope_parameters");
    /* layer plan */
    EXPECT_FAIL(k_next_small, "'full_attention'],", "'full_attention','full_attention'],", QD_ERR_FORMAT,
                "layer_types");
    EXPECT_FAIL(k_next_small, "'layer_types':['linear_attention'", "'layer_types':['sliding_attention'",
                QD_ERR_FORMAT, "layer_types[0]");
    EXPECT_FAIL(k_35moe, "'full_attention_interval':4", "'full_attention_interval':0", QD_ERR_FORMAT,
                "full_attention_interval");
    EXPECT_FAIL(k_next, "'num_hidden_layers':48", "'num_hidden_layers':300", QD_ERR_UNSUPPORTED, "num_hidden_layers");
    EXPECT_FAIL(k_next, "'num_hidden_layers':48", "'num_hidden_layers':0", QD_ERR_FORMAT, "num_hidden_layers");
    /* dims and consistency */
    EXPECT_FAIL(k_next, "'hidden_size':2048", "'hidden_size':-1", QD_ERR_FORMAT, "hidden_size");
    EXPECT_FAIL(k_next, "'linear_num_value_heads':32", "'linear_num_value_heads':24", QD_ERR_FORMAT,
                "linear_num_value_heads");
    EXPECT_FAIL(k_next, "'num_key_value_heads':2", "'num_key_value_heads':3", QD_ERR_FORMAT, "num_key_value_heads");
    EXPECT_FAIL(k_next, "'num_experts_per_tok':10", "'num_experts_per_tok':600", QD_ERR_FORMAT, "num_experts_per_tok");
    EXPECT_FAIL(k_next, "'decoder_sparse_step':1", "'decoder_sparse_step':0", QD_ERR_FORMAT, "decoder_sparse_step");
    EXPECT_FAIL(k_next, "'partial_rotary_factor':0.25", "'partial_rotary_factor':0.0", QD_ERR_FORMAT,
                "partial_rotary_factor");
    EXPECT_FAIL(k_next_small, "'rms_norm_eps'", "'head_dim':10,'partial_rotary_factor':0.5,'rms_norm_eps'",
                QD_ERR_FORMAT, "even");
    EXPECT_FAIL(k_next, "'linear_num_value_heads':32", "'linear_num_value_heads':16000000", QD_ERR_FORMAT,
                "conv_dim");
    EXPECT_FAIL(k_next, "'head_dim':256", "'head_dim':20000000", QD_ERR_FORMAT, "head_dim");
    /* unsupported RoPE scaling is refused rather than ignored */
    EXPECT_FAIL(k_35, "'rope_type':'default'", "'rope_type':'yarn'", QD_ERR_UNSUPPORTED, "yarn");
    EXPECT_FAIL(k_next, "'rope_scaling':null", "'rope_scaling':{'type':'linear','factor':2}", QD_ERR_UNSUPPORTED,
                "rope_scaling.type");
    EXPECT_FAIL(k_next, "'rope_scaling':null", "'rope_scaling':4", QD_ERR_FORMAT, "rope_scaling");
    /* not JSON / not an object */
    EXPECT_FAIL(k_next, "{'architectures'", "{{'architectures'", QD_ERR_FORMAT, "JSON");
    EXPECT_FAIL("[1]", NULL, NULL, QD_ERR_FORMAT, "object");
    EXPECT_FAIL(k_next, "'vocab_size':151936}", "'vocab_size':151936,'vocab_size':5}", QD_ERR_FORMAT, "duplicate");
    /* out stays zeroed on failure */
    qd_config c;
    qd_err e;
    c.hidden_size = 77;
    parse(k_next, "'vocab_size':151936", "'vocab_size':0", &c, &e);
    CHECK(c.hidden_size == 0 && c.n_layers == 0);
}

static void test_load(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/qd_cfg_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) { perror("mkdtemp"); CHECK(0); return; }
    qd_config c;
    qd_err e = {0};
    qd_status s = qd_config_load(dir, &c, &e);
    CHECKF(s == QD_ERR_NOT_FOUND && strstr(e.msg, "config.json") && strstr(e.msg, dir), "%s", e.msg);
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = J(k_35, NULL, NULL);
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
    free(text);
    s = qd_config_load(dir, &c, &e);
    CHECKF(s == QD_OK && c.arch == QD_ARCH_QWEN3_5 && c.hidden_size == 1024, "%s", e.msg);
    f = fopen(path, "wb");
    fputs("{\"model_type\":\"qwen3_next\"}", f);
    fclose(f);
    s = qd_config_load(dir, &c, &e);
    CHECKF(s == QD_ERR_NOT_FOUND && strstr(e.msg, path) && strstr(e.msg, "hidden_size"), "%s", e.msg);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    test_qwen3_next();
    test_qwen3_5();
    test_errors();
    test_load();
    return qd_test_finish("test_config");
}
