/* The timeline of one forward inside its CUDA graph, for profiling builds (cmake
 * -DQD_CUDA_TIMELINE=ON; scripts/gpu-check.sh timeline; bench/timeline.py reads the file).
 *
 * Nsight Systems does not run on our GPU image, and Nsight Compute times kernels one at a
 * time, serialised, so neither shows how the kernels of a graph overlap. In a timeline build,
 * thread 0 of each of the first QD_TL_BLOCKS blocks of every kernel that waits through
 * qd_pdl_wait (cuda_pdl.cuh) reads the global timer when it reaches its wait and when the wait
 * releases it, and stores both with the grid's id, during the QD_CUDA_TIMELINE_STEP-th forward
 * of the process. At the next forward the records go to qdelta-timeline.txt in the working
 * directory, with the kernel name and grid of every launch captured into a graph (in capture
 * order), from which bench/timeline.py pairs grids with kernels.
 *
 * The table sits at a fixed device address (QD_TL_BASE, reserved and mapped with the driver's
 * virtual-memory calls at the first launch or forward) because every .cu file is compiled on
 * its own and they cannot share a __device__ pointer. Other builds compile the same host code
 * and never record. */
#ifndef QD_CUDA_TIMELINE_H
#define QD_CUDA_TIMELINE_H

#ifdef QD_CUDA_TIMELINE
#define QD_CUDA_TIMELINE_ON 1
#else
#define QD_CUDA_TIMELINE_ON 0
#endif
#ifndef QD_CUDA_TIMELINE_STEP
#define QD_CUDA_TIMELINE_STEP 32 /* a decode step well past warm-up and graph capture */
#endif

#define QD_TL_BASE 0x600000000000ull /* [0]: recording on; records from QD_TL_HEAD */
#define QD_TL_HEAD 4096ull
#define QD_TL_GRIDS (1ull << 17)     /* grid-id hash buckets */
#define QD_TL_BLOCKS 128ull          /* blocks recorded of a grid */
#define QD_TL_REC 32ull              /* grid id, t at the wait, t at the release, grid size | SM | block */
#define QD_TL_BYTES (QD_TL_HEAD + QD_TL_GRIDS * QD_TL_BLOCKS * QD_TL_REC)

#ifdef __cplusplus
extern "C" {
#endif

/* At the start of every forward: arms the recording at the chosen forward, writes the file at
 * the next. No-op outside timeline builds. */
void qd_cuda_timeline_forward(void *stream);
/* At every launch of the PDL wrapper: the kernel's name and grid when the stream is capturing. */
void qd_cuda_timeline_launch(const void *kernel, unsigned gx, unsigned gy, unsigned gz, void *stream);

#ifdef __cplusplus
}
#endif

#endif
