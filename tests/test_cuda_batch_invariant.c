/* Batch-invariant mode through the engine on the CUDA backend (skipped without a
 * GPU): the gpu_* fixtures, whose head dims (128) take the chunked GDN and attention
 * kernels of the released models (batch_invariant_body.h). */
#include "qd_test.h"

#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_device.h"
#include "batch_invariant_body.h"

int main(void) {
    if (qd_cuda_device_count() <= 0) return qd_test_skip("test_cuda_batch_invariant", "no CUDA device");
    rng = qd_test_rng_from_env();
    bi_cost_model_expected = 0;
    const char *dirs[] = {"tests/fixtures/gpu_qwen3_5_dense_bf16", "tests/fixtures/gpu_qwen3_5_moe_bf16",
                          "tests/fixtures/gpu_qwen3_next_moe_bf16"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        qd_model *m = qd_fixture_load(dirs[i], QD_BACKEND_CUDA, 1);
        if (!m) continue;
        if (i == 0) bi_check_params(m);
        bi_check_model(m, dirs[i]);
        qd_model_free(m);
    }
    return qd_test_finish("test_cuda_batch_invariant");
}

#else /* no CUDA compiler: nothing to test */

int main(void) { return qd_test_skip("test_cuda_batch_invariant", "built without CUDA"); }

#endif
