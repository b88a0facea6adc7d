/* The CUDA backends' entries in a build without a CUDA compiler (CMake compiles this
 * file instead of src/backend/cuda and src/parallel/cuda). */
#include "backend/backend.h"

static const qd_backend_ops *absent(qd_err *err) {
    qd_seterr(err, QD_ERR_UNSUPPORTED, "this build of qdelta has no CUDA backend (no CUDA compiler at build time)");
    return NULL;
}

const qd_backend_ops *qd_backend_cuda(qd_err *err) { return absent(err); }
const qd_backend_ops *qd_backend_split_cuda(qd_err *err) { return absent(err); }
