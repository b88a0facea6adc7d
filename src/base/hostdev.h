/* QD_HD marks a small inline function that both the host (C) and the CUDA kernels call,
 * so that the two compute one definition (base/dtype.h, base/dummy_values.h). */
#ifndef QD_BASE_HOSTDEV_H
#define QD_BASE_HOSTDEV_H

#ifdef __CUDACC__
#define QD_HD static inline __host__ __device__
#else
#define QD_HD static inline
#endif

#endif
