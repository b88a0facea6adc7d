/* test_backend_ops (tests/test_backend_ops.c): the framework its op rows share. Each
 * tests/backend_ops/ops_*.c holds a family of ops: per op a generator of fresh random
 * inputs, a naive double-precision reference and one runner per backend, its shape cases
 * and its row (op_row, declared at the end here); the driver runs the rows in the order of
 * its table. */
#ifndef QD_TEST_BACKEND_OPS_H
#define QD_TEST_BACKEND_OPS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_ops.h"
#include "base/dtype.h"
#include "base/threadpool.h"
#include "backend/cpu/cpu_backend.h"
#include "qd_test.h"
#ifdef QD_HAVE_CUDA
#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_linear.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_ops.h"
#include "qd_test_cuda.h"
#endif

#define MAX_SPANS 8
#define MAX_IN 12

/* One shape case. The fields are generic sizes; each row's comment says which it
 * reads (e.g. matmul: n x cols times rows x cols). Unused fields stay 0. */
typedef struct op_case {
    int n, rows, cols, heads, kv_heads, dim, dim2, K, mode;
    int n_spans;
    int lens[MAX_SPANS]; /* token counts of the spans (GDN, attention) */
    int pos[MAX_SPANS];  /* start positions of the spans (attention) */
} op_case;

/* Fresh inputs of one case: float tensors f[] and index tensors i[] whose meaning
 * each op defines (enums below), and the number of floats the op outputs. */
typedef struct op_data {
    const op_case *c;
    float *f[MAX_IN];
    size_t nf[MAX_IN];
    int32_t *i[4];
    size_t ni[4];
    size_t n_out;
} op_data;

enum { OP_OK = 0, OP_SKIP = 1, OP_FAIL = 2 };

/* Per element: |got - ref| <= atol + arms * rms(ref) + amax * max|ref| + rtol * |ref|
 * (NaN fails); over the tensor, relative L2 error <= l2 when l2 > 0. */
typedef struct tol {
    double rtol, atol, arms, amax, l2;
} tol;

enum { BK_CPU = 0, BK_CUDA = 1, N_BACKENDS = 2 };

typedef int (*op_runner)(const op_data *d, float *out);

typedef struct op_row {
    const char *name;
    const op_case *cases;
    int n_cases;
    void (*make)(op_data *d, qd_test_rng *rng);   /* inputs and n_out */
    void (*naive)(const op_data *d, double *out); /* the double-precision reference */
    op_runner run[N_BACKENDS];                    /* NULL: the backend has no such op */
    tol tol[N_BACKENDS];
} op_row;

/* The CPU backend's thread pool, made by the driver. */
extern qd_threadpool *g_pool;

/* Inputs and outputs (the allocations end the test on failure: every size here is small, so
 * it is a bug). in_rand: a float input of n elements, normal * scale, bf16-representable
 * when bf16; shuffle: a random permutation of 0..n-1 (slots, block tables). */
void *xmalloc(size_t n);
float *nan_floats(size_t n);
float bf16_round(float x);
float *in_rand(op_data *d, int slot, size_t n, float scale, int bf16, qd_test_rng *rng);
float *in_zero(op_data *d, int slot, size_t n);
int32_t *in_idx(op_data *d, int slot, size_t n);
void shuffle(int32_t *p, int n, qd_test_rng *rng);
void free_data(op_data *d);
int span_total(const op_case *c);
int span_first(const op_case *c, int s);

/* The naive pieces, in double: silu, sigmoid, y = x (sum x^2 / dim + eps)^-1/2 (off + w)
 * (naive_rmsnorm), and NeoX rotate-half on the first rot dims of one head at position pos
 * (naive_rope: the angle as HF computes it, helpers.c). */
double naive_silu(double x);
double naive_sigmoid(double x);
void naive_rmsnorm(const float *x, int dim, const float *w, double off, double eps, double *y);
void naive_rope(double *v, int rot, double theta, int pos);

#define RN_EPS 1e-6f /* the norms' epsilon (the norm rows and the linear's built inputs) */

#ifdef QD_HAVE_CUDA
/* Device buffers of one runner, freed together (da_done); ok drops to 0 on any failure.
 * da_alloc uploads h (or, without it, poisons the buffer: NaN as fp32 and bf16, -1 as
 * int32); da_bf16 a bf16 copy of bf16-representable floats; da_get_* read back after the
 * device is idle. */
typedef struct dev_arena {
    void *p[48];
    int n, ok;
} dev_arena;

void *da_alloc(dev_arena *a, const void *h, size_t bytes);
uint16_t *da_bf16(dev_arena *a, const float *x, size_t n);
float *da_f32(dev_arena *a, const float *x, size_t n);
int32_t *da_i32(dev_arena *a, const int32_t *x, size_t n);
void da_st(dev_arena *a, qd_status st, const char *what);
void da_get_f32(dev_arena *a, float *out, const float *d, size_t n);
void da_get_bf16(dev_arena *a, float *out, const uint16_t *d, size_t n);
int da_done(dev_arena *a);
#define DA_ST(a, call) da_st((a), (call), #call)
extern qd_cuda_blas *g_blas; /* created once by the driver when the CUDA backend is present */
#define CU(f) f
#else
#define CU(f) NULL
#endif

#define NCASES(a) (int)(sizeof(a) / sizeof((a)[0]))

/* Tolerances (per element: atol + arms rms(ref) + amax max|ref| + rtol |ref|; l2):
 *   cpu vs naive: fp32 arithmetic. Sums of many products (matmul, attention, the delta
 *     rule) round at ~1e-7 of the sum of |terms|, which relative to rms(ref) is ~1e-6
 *     for sums of a few thousand random terms: arms 1e-5 (2e-4 for the chunked WY form,
 *     whose intra-chunk products and decays differ in order: test_gdn's 1e-4 of max).
 *     Elementwise ops: rtol 1e-5.
 *   cuda vs cpu: bf16 outputs round at 2^-9 relative, and a 1e-6 difference before
 *     rounding may land one bf16 step away: rtol 8e-3 (2^-7). fp32 outputs: fp32
 *     tolerances. Matmuls: fp32 accumulation in another order over the same bf16
 *     inputs: 3e-4 of rms (1e-5 of the sum of |terms|, test_cuda_ops). Attention:
 *     bf16 P and output (test_cuda_attn: 2e-2 of max, L2 1e-2); GDN decode: 1e-2
 *     rel + 1e-2 rms, L2 4e-3; chunked: bf16 tensor-core operands in sums of up to
 *     ~200 terms, 0.2 rms per element and 1.5e-2 in L2 (test_cuda_gdn); MoE experts:
 *     bf16 activations, 3e-2 rms, L2 5e-3 (test_cuda_moe); the fused linear rounds x
 *     to bf16: 2e-2 rms, L2 1e-2 (test_cuda_fused: 4/256 of the terms' l2). */
#define T_CPU_SUM {1e-5, 1e-6, 1e-5, 0, 0}
#define T_CPU_EW {1e-5, 1e-6, 1e-6, 0, 0}
#define T_BF16 {8e-3, 1e-6, 0, 0, 0}
#define T_F32_EW {1e-5, 1e-7, 0, 0, 0}

/* The rows, in the driver's order (ops_matmul.c, ops_norm.c, ops_gdn.c, ops_attn.c). */
extern const op_row OP_MATMUL, OP_MATMUL_FIXED_ORDER, OP_MATMUL_XF32, OP_RMSNORM, OP_ADD_RMSNORM, OP_GATED_RMSNORM,
    OP_CONV1D_SILU, OP_L2NORM_HEADS, OP_GDN_GATES, OP_GDN_INPUTS, OP_ROPE_NEOX, OP_SILU_MUL, OP_GDN_RECURRENT,
    OP_GDN_RECURRENT_MULTI, OP_GDN_CHUNKED, OP_ATTENTION, OP_ATTN_BLOCK, OP_MOE_ROUTE, OP_MOE_EXPERTS, OP_LINEAR;

#endif
