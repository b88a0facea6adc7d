/* Device side of the quantized layouts (cuda_quant.h): a 16-byte piece of a weight row
 * decoded in registers. Each format is a class with
 *   COLS   columns in one 16-byte piece (16 e4m3, 32 4-bit codes)
 *   NSUB   scale blocks in a piece (NVFP4: 2 of 16 columns; F8_E4M3, INT4: 1, the layouts
 *          qd_cuda_qlayout_vectorised takes keep a piece inside one block)
 *   decode8(raw, q8, z, w)  columns 8 q8 .. 8 q8 + 7 of the piece before their scale (INT4: q - z),
 *                       so a kernel holds 8 decoded values at a time whatever the format
 *                       (4-bit formats: decode_word(u, z, w) of the piece's 32-bit word q8;
 *                       F8_E4M3: decode_words(u0, u1, w) of its words 2 q8, 2 q8 + 1; the one
 *                       definition the W4A16 / W8A16 grouped GEMM also decodes by)
 *   scale(row, c0, j)   the block scale of sub-block j of the piece starting at column c0
 *   post(row)           a factor of the whole matrix after the block scale (NVFP4's global)
 * and qf_row (one row of one matrix: where its bytes, scales and zeros are). A product
 * takes the piece's partial sum per sub-block and multiplies it by the scale once, so a
 * scale costs one multiply per piece rather than one per element. */
#ifndef QD_CUDA_QFORMAT_CUH
#define QD_CUDA_QFORMAT_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.h"

typedef struct qf_row {
    const uint8_t *q;     /* the row's stored bytes */
    const void *s;        /* the row's scales: F32 [nbc] (F8_E4M3, INT4) or e4m3 [cols / 16] (NVFP4) */
    const uint8_t *z;     /* INT4: the row's zero points or NULL */
    float g;              /* NVFP4: the matrix's global factor times 2^14 (see qf_nvfp4) */
    int bc;               /* block / group columns */
    int bcs;              /* column c's block as c >> bcs where bc is a power of two or spans the
                           * row (31), else -1: c / bc */
} qf_row;

/* Column c0's block or group of a row whose blocks are bc columns (bcs as qf_row.bcs). */
__device__ __forceinline__ int qf_blk_of(int c0, int bc, int bcs) { return bcs >= 0 ? c0 >> bcs : c0 / bc; }
__device__ __forceinline__ int qf_blk(const qf_row &r, int c0) { return qf_blk_of(c0, r.bc, r.bcs); }

/* NVFP4: matrix mat's global factor (per matrix, or one for all). */
__device__ __forceinline__ float qf_global_of(const qd_cuda_qmats &m, int64_t mat) {
    return m.globals ? __ldg(m.globals + mat) : m.global;
}

/* NVFP4: matrix mat's global factor times 2^14 (see qf_nvfp4); 1 for the other formats. */
__device__ __forceinline__ float qf_post_of(const qd_cuda_qmats &m, int64_t mat) {
    return m.dtype == QD_DTYPE_NVFP4 ? qf_global_of(m, mat) * 16384.0f : 1.0f;
}

/* Row r of matrix mat of m. */
__device__ __forceinline__ qf_row qf_row_of(const qd_cuda_qmats &m, int64_t mat, int64_t r) {
    qf_row w;
    w.q = m.data + (mat * m.rows + r) * m.row_bytes;
    const int64_t si = (mat * m.scale_rows + (m.row_shift >= 0 ? r >> m.row_shift : r / m.block_rows)) * m.nbc;
    w.s = m.dtype == QD_DTYPE_NVFP4 ? (const void *)((const uint8_t *)m.scales + si)
                                    : (const void *)((const float *)m.scales + si);
    w.z = m.zeros ? m.zeros + si : (const uint8_t *)0;
    w.g = qf_post_of(m, mat);
    w.bc = (int)m.block_cols;
    w.bcs = m.col_shift;
    return w;
}

/* Two e4m3 (low byte first) as two floats: the hardware conversion to f16 (exact: every
 * e4m3 value is an f16 value), then widened. */
__device__ __forceinline__ float2 qf_e4m3x2(uint32_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    __half2 hh;
    *reinterpret_cast<__half2_raw *>(&hh) = h;
    return __half22float2(hh);
}

__device__ __forceinline__ float qf_e4m3(uint32_t v) { return qf_e4m3x2(v & 0xffu).x; }

__device__ __forceinline__ uint32_t qf_word(const uint4 &r, int i) {
    return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}

/* bf16 (the unquantized experts share the kernels): 8 columns a piece, no scale. */
struct qf_bf16 {
    static constexpr int COLS = 8, NSUB = 1, DTYPE = QD_DTYPE_BF16;
    __device__ static __forceinline__ void decode8(const uint4 &v, int q8, int z, float f[8]) {
        (void)q8; (void)z;
        qd_bf16x8_f32(v, f);
    }
    __device__ static __forceinline__ float scale(const qf_row &r, int c0, int j) { (void)r; (void)c0; (void)j; return 1.0f; }
    __device__ static __forceinline__ int zero(const qf_row &r, int c0) { (void)r; (void)c0; return 0; }
    __device__ static __forceinline__ float post(const qf_row &r) { (void)r; return 1.0f; }
};

struct qf_f8 {
    static constexpr int COLS = 16, NSUB = 1, DTYPE = QD_DTYPE_F8_E4M3;
    /* 8 columns from two 32-bit words of e4m3 (low byte first): the one definition decode8
     * and the W8A16 grouped GEMM's converter (moe_prefill_wa16.cu) decode by */
    __device__ static __forceinline__ void decode_words(uint32_t u0, uint32_t u1, float w[8]) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t u = i == 0 ? u0 : u1;
            const float2 a = qf_e4m3x2(u), b = qf_e4m3x2(u >> 16);
            w[4 * i] = a.x; w[4 * i + 1] = a.y; w[4 * i + 2] = b.x; w[4 * i + 3] = b.y;
        }
    }
    __device__ static __forceinline__ void decode8(const uint4 &raw, int q8, int z, float w[8]) {
        (void)z;
        decode_words(qf_word(raw, 2 * q8), qf_word(raw, 2 * q8 + 1), w);
    }
    __device__ static __forceinline__ float scale(const qf_row &r, int c0, int j) {
        (void)j;
        return __ldg((const float *)r.s + qf_blk(r, c0));
    }
    __device__ static __forceinline__ int zero(const qf_row &r, int c0) { (void)r; (void)c0; return 0; }
    __device__ static __forceinline__ float post(const qf_row &r) { (void)r; return 1.0f; }
};

/* 4-bit codes: element 2j of a byte in its low nibble, so element e of a 32-bit word is
 * bits 4e..4e+3 (little-endian words). */
struct qf_int4 {
    static constexpr int COLS = 32, NSUB = 1, DTYPE = QD_DTYPE_INT4;
    /* q - z exactly: 2^23 + q as a float's bits, minus 2^23 + z */
    __device__ static __forceinline__ void decode_word(uint32_t u, int z, float w[8]) {
        const float off = 8388608.0f + (float)z;
        /* the even and the odd codes a byte each, then one byte permute a code into 2^23's bits
         * (0x4b0000cc): 11 instructions fewer a word than a shift, a mask and an or a code */
        const uint32_t lo = u & 0x0f0f0f0fu, hi = (u >> 4) & 0x0f0f0f0fu;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            w[2 * b] = __uint_as_float(__byte_perm(lo, 0x4b000000u, 0x7650u + b)) - off;
            w[2 * b + 1] = __uint_as_float(__byte_perm(hi, 0x4b000000u, 0x7650u + b)) - off;
        }
    }
    __device__ static __forceinline__ void decode8(const uint4 &raw, int q8, int z, float w[8]) {
        decode_word(qf_word(raw, q8), z, w);
    }
    __device__ static __forceinline__ float scale(const qf_row &r, int c0, int j) {
        (void)j;
        return __ldg((const float *)r.s + qf_blk(r, c0));
    }
    __device__ static __forceinline__ int zero(const qf_row &r, int c0) { return r.z ? (int)__ldg(r.z + qf_blk(r, c0)) : 8; }
    __device__ static __forceinline__ float post(const qf_row &r) { (void)r; return 1.0f; }
};

/* e2m1 (sign, 2 exponent bits of bias 1, 1 mantissa bit) placed in an f16's bits: sign to
 * bit 15, exponent and mantissa to bits 11..9. That f16 is the e2m1 value times 2^-14 for
 * every code (subnormal 0.5 included), so the 2^14 joins the global factor (qf_row.g). */
struct qf_nvfp4 {
    static constexpr int COLS = 32, NSUB = 2, DTYPE = QD_DTYPE_NVFP4;
    __device__ static __forceinline__ void decode_word(uint32_t u, int z, float w[8]) {
        (void)z;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const uint32_t v = u >> (8 * b);
            const uint32_t h = ((v & 8u) << 12) | ((v & 7u) << 9) | ((v & 0x80u) << 24) | ((v & 0x70u) << 21);
            __half2 hh;
            *reinterpret_cast<uint32_t *>(&hh) = h;
            const float2 f = __half22float2(hh);
            w[2 * b] = f.x;
            w[2 * b + 1] = f.y;
        }
    }
    __device__ static __forceinline__ void decode8(const uint4 &raw, int q8, int z, float w[8]) {
        decode_word(qf_word(raw, q8), z, w);
    }
    __device__ static __forceinline__ float scale(const qf_row &r, int c0, int j) {
        return qf_e4m3(__ldg((const uint8_t *)r.s + c0 / 16 + j));
    }
    __device__ static __forceinline__ int zero(const qf_row &r, int c0) { (void)r; (void)c0; return 0; }
    __device__ static __forceinline__ float post(const qf_row &r) { return r.g; }
};

#endif
