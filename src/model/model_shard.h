/* A rank's model of a split model (src/parallel/shard.h plans the split): its weights
 * cut from a loaded full model, or read straight from the checkpoint. */
#ifndef QD_MODEL_MODEL_SHARD_H
#define QD_MODEL_MODEL_SHARD_H

#include "model/model.h"
#include "parallel/shard.h"

/* Slices of a row-major [rows][cols] weight, the same for a loaded weight and for a
 * checkpoint tensor (the data pointer may be inside the mmapped file): rows are a view;
 * rows gathered from several runs (a view when the runs are contiguous) and columns
 * (a view when whole) are copied into a buffer owned by m. */
qd_weight qd_shard_rows_view(const qd_weight *w, qd_shard_range r);
qd_status qd_shard_rows_gather(qd_model *m, const qd_weight *w, const qd_shard_range *runs, int n, qd_weight *out,
                               qd_err *err);
qd_status qd_shard_cols_copy(qd_model *m, const qd_weight *w, qd_shard_range c, qd_weight *out, qd_err *err);

/* Builds rank p's model from a loaded full model: row slices of a weight are views into
 * the full model's weights, column slices and the three-run in_proj_qkv / conv1d slices
 * are copies the rank model owns (the MTP head's layer is sliced alike, when the full
 * model has one); it gets a CPU backend model. The rank model shares the
 * full model's thread pool and must be freed (qd_shard_model_free) before it. */
qd_status qd_shard_model_slice(qd_model *full, const qd_shard_plan *p, qd_model **out, qd_err *err);
/* Builds rank p's model straight from the checkpoint that `top` has mapped (top->st; no
 * full model is loaded): the same weights qd_shard_model_slice cuts (the MTP head's
 * included), reading only the rank's slices. With top->st NULL the rank draws dummy weights of its own shapes
 * (seed, dtype), a different random model than the unsplit one. The rank model has no
 * backend model of its own (the split backend makes one from its weights on the rank's
 * device; qd_shard_model_drop_host then frees what only an upload read). It borrows top's mapping and thread pool; free it with
 * qd_shard_model_free before top. */
qd_status qd_shard_model_load(qd_model *top, const qd_shard_plan *p, uint64_t seed, qd_dtype dummy_dtype,
                              qd_model **out, qd_err *err);
void qd_shard_model_free(qd_model *m);
/* Frees the host weights a rank model owns and clears the pointers to them (after a
 * backend that copies its weights has made its model from them). */
void qd_shard_model_drop_host(qd_model *m);

#endif
