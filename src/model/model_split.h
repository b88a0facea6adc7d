/* A split model's ranks (model_backend.c): the sharding plans and the rank models, each
 * binding its slices of the checkpoint; the split backend makes the rank backends from
 * them. */
#ifndef QD_MODEL_MODEL_SPLIT_H
#define QD_MODEL_MODEL_SPLIT_H

#include "model/model_shard.h"

typedef struct qd_model_split {
    int size;
    bool expert_parallel;
    qd_shard_plan *plans;            /* [size] */
    qd_model **ranks;                /* [size] */
    qd_backend_model_desc *descs;    /* [size] what the split backend is handed per rank */
    bool mtp;                        /* every rank holds its slice of the MTP head */
} qd_model_split;

/* After the rank models are bound: whether the split model has an MTP head (every rank
 * bound its slices), and, when not, top->mtp_missing from the first rank without one. */
void qd_model_split_mtp(qd_model *top);

#endif
