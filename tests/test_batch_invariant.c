/* Batch-invariant mode through the engine on the CPU backend: the fp32 and bf16
 * fixtures of every architecture and the embedded qdelta-tiny (batch_invariant_body.h). */
#include "batch_invariant_body.h"

int main(void) {
    rng = qd_test_rng_from_env();
    const char *dirs[] = {"tests/fixtures/qwen3_5_dense_f32", "tests/fixtures/qwen3_5_moe_fused_bf16",
                          "tests/fixtures/qwen3_next_dense_flat_norenorm_f32", "tests/fixtures/qwen3_next_moe_bf16",
                          "models/qdelta-tiny"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        qd_model *m = qd_fixture_load(dirs[i], QD_BACKEND_CPU, 1);
        if (!m) continue;
        if (i == 0) bi_check_params(m);
        bi_check_model(m, dirs[i]);
        qd_model_free(m);
    }
    return qd_test_finish("test_batch_invariant");
}
