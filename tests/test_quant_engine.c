/* Quantized weights through the serving engine on the CPU: batch-invariant mode, chunked
 * prefills, preemption and the prefix cache (restored states) give bit-identical tokens and
 * logprobs to each request's solo run (batch_invariant_body.h), for an FP8 block-128 model
 * (Qwen3-Next, interleaved in_proj_qkvz, per-expert MoE), a GPTQ act-order model and an NVFP4
 * model (Qwen3.5 composite). */
#include "batch_invariant_body.h"

int main(void) {
    rng = qd_test_rng_from_env();
    const char *dirs[] = {"tests/fixtures/quant/fp8_next_moe", "tests/fixtures/quant/gptq1_35_dense",
                          "tests/fixtures/quant/nvfp4ct_35_dense"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        qd_model *m = qd_fixture_load(dirs[i], QD_BACKEND_CPU, 1);
        if (!m) continue;
        if (i == 0) bi_check_params(m);
        bi_check_model(m, dirs[i]);
        qd_model_free(m);
    }
    return qd_test_finish("test_quant_engine");
}
