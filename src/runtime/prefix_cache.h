/* Prefix cache for hybrid models: a radix tree over token ids whose nodes may hold a
 * snapshot of the GDN state (conv + recurrent, every GDN layer) at the position where
 * the node ends, together with references to the KV blocks covering that prefix.
 *
 * Why snapshots at positions and not per block: the GDN state is a running summary,
 * so a prefix can only be resumed where the state was saved; attention KV on the
 * other hand is append-only and can be resumed anywhere it is present. A hit is
 * therefore the deepest node on the query's path that has a snapshot, at any token
 * position (also inside a KV block: the partly filled last block is shared and the
 * sequence copies it before writing, see qd_kv_reserve).
 *
 * Trees are kept per model identity key (the base model now; a LoRA adapter id
 * later), so a snapshot never crosses models. Memory: each snapshot costs
 * snapshot_bytes, each distinct KV block referenced by the cache block_bytes; when
 * the sum passes the budget, the least recently used snapshots go first. Nodes only
 * hold references, so evicting never touches what a running sequence uses.
 *
 * Not thread-safe: the engine thread owns it. */
#ifndef QD_RUNTIME_PREFIX_CACHE_H
#define QD_RUNTIME_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "qdelta.h"

typedef struct qd_prefix_cache qd_prefix_cache;

typedef struct qd_prefix_cache_stats {
    uint64_t hit_tokens, query_tokens;  /* summed over qd_prefix_cache_count_query */
    uint64_t evictions;                 /* snapshots evicted */
    uint64_t inserts;                   /* snapshots stored */
    int snapshots;                      /* snapshots held now */
    int blocks;                         /* distinct KV blocks referenced now */
    int nodes;                          /* tree nodes (without the roots) */
    size_t bytes;                       /* snapshots * snapshot_bytes + blocks * block_bytes */
    size_t budget;
} qd_prefix_cache_stats;

/* ctx may be NULL (then no KV blocks are handled: n_blocks must be 0 everywhere);
 * otherwise the cache takes and drops references to ctx's KV blocks. */
qd_status qd_prefix_cache_create(qd_context *ctx, size_t budget_bytes, size_t snapshot_bytes, size_t block_bytes,
                                 qd_prefix_cache **out, qd_err *err);
/* Drops every reference the cache holds. */
void qd_prefix_cache_free(qd_prefix_cache *pc);

typedef struct qd_prefix_hit {
    int n_tokens;            /* length of the hit (0: none); the snapshot covers tokens[0..n_tokens) */
    int n_matched;           /* tokens of the query present in the tree (>= n_tokens), snapshot or not */
    const void *snapshot;    /* snapshot_bytes, valid until the next insert or eviction */
    const int32_t *blocks;   /* KV blocks covering tokens[0..n_tokens) */
    int n_blocks;
} qd_prefix_hit;

/* Longest prefix of tokens[0..n) (n itself included) that has a snapshot under `key`;
 * marks it most recently used. */
void qd_prefix_cache_lookup(qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, qd_prefix_hit *hit);
/* Adds to the hit and query token counters (what the engine actually used). */
void qd_prefix_cache_count_query(qd_prefix_cache *pc, int query_tokens, int hit_tokens);

/* Makes room for a snapshot of tokens[0..n) with the given KV blocks (references are
 * taken). Returns the buffer of snapshot_bytes to fill, or NULL when a snapshot at
 * exactly that prefix already exists (it is marked used), on out of memory, or when
 * n < 1. The caller fills the buffer at once; afterwards the budget is enforced, so
 * the new snapshot may be the one evicted when it alone is larger than the budget. */
void *qd_prefix_cache_insert(qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, const int32_t *blocks,
                             int n_blocks);
/* Evicts snapshots, least recently used first, until the budget holds. Call after
 * filling the buffer that insert returned. */
void qd_prefix_cache_enforce_budget(qd_prefix_cache *pc);
/* KV blocks that only the cache holds: what evicting everything would give back to
 * the pool at most (so the engine does not empty the cache when that cannot help). */
int qd_prefix_cache_reclaimable_blocks(const qd_prefix_cache *pc);
/* Evicts the least recently used snapshot; 0 when there is none. */
int qd_prefix_cache_evict_one(qd_prefix_cache *pc);

void qd_prefix_cache_get_stats(const qd_prefix_cache *pc, qd_prefix_cache_stats *out);

/* For tests: the depth (token count) of every snapshot node on the path of tokens,
 * written to depths[] (at most max); returns how many. Also checks the tree's
 * invariants (depths, parent links, block counts); returns -1 if one is broken. */
int qd_prefix_cache_check(const qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, int *depths, int max);

#endif
