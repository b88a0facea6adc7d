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
 * Two tiers of snapshot memory:
 *   device: the context's snapshot slots (qd_snap_*), in the memory the state lives
 *           in (GPU memory with the CUDA backend, host memory with the CPU backend).
 *           Taking and restoring a snapshot are copies inside that memory, queued on
 *           the context's stream: no host synchronisation, no PCIe traffic.
 *   host:   optional, plain host buffers (qd_seq_state_save format). When the device
 *           tier is full, its least recently used snapshot moves here (a device to
 *           host copy) instead of being dropped; a hit restores from either tier.
 * Budgets: the device budget covers the device snapshots plus the KV blocks the cache
 * references (they live in the context's KV pool, whichever tier holds the snapshot);
 * the host budget covers the host snapshots. Over a budget, least recently used
 * snapshots move down (device -> host, when the host budget can take one) or are
 * dropped. Nodes only hold copies and block references, so neither moving nor
 * dropping ever touches what a running sequence uses: a restore copies the snapshot
 * into the sequence's own state, and the blocks it shares are reference counted.
 * (On the GPU the restore copy may still be queued when its slot is refilled; the
 * stream runs them in order.)
 *
 * Trees are kept per model identity key (the base model now; a LoRA adapter id
 * later), so a snapshot never crosses models. Not thread-safe: the engine thread
 * owns it. */
#ifndef QD_RUNTIME_PREFIX_CACHE_H
#define QD_RUNTIME_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "qdelta.h"

typedef struct qd_prefix_cache qd_prefix_cache;

typedef enum qd_prefix_tier { QD_TIER_NONE = 0, QD_TIER_DEVICE, QD_TIER_HOST } qd_prefix_tier;

typedef struct qd_prefix_cache_params {
    size_t device_bytes;  /* device snapshots (the context's slots) + referenced KV blocks */
    size_t host_bytes;    /* host snapshots; 0: no host tier (what leaves the device is dropped) */
    size_t block_bytes;   /* one KV block as the budget counts it (keys and values) */
} qd_prefix_cache_params;

typedef struct qd_prefix_cache_stats {
    uint64_t hit_tokens, query_tokens;  /* summed over qd_prefix_cache_count_query */
    uint64_t evictions;                 /* snapshots dropped (either tier) */
    uint64_t spills;                    /* snapshots moved from the device tier to the host tier */
    uint64_t host_restores;             /* restores served from the host tier */
    uint64_t inserts;                   /* snapshots stored */
    int snapshots;                      /* held now, both tiers */
    int device_snapshots, host_snapshots;
    int blocks;                         /* distinct KV blocks referenced now */
    int nodes;                          /* tree nodes (without the roots) */
    size_t device_bytes;                /* device_snapshots * slot bytes + blocks * block_bytes */
    size_t host_bytes;                  /* host_snapshots * host snapshot bytes */
    size_t bytes;                       /* device_bytes + host_bytes */
    size_t budget, host_budget;
} qd_prefix_cache_stats;

/* The device tier uses all of ctx's snapshot slots (qd_context_params.n_snap_slots);
 * the cache takes and drops references to ctx's KV blocks. */
qd_status qd_prefix_cache_create(qd_context *ctx, const qd_prefix_cache_params *params, qd_prefix_cache **out,
                                 qd_err *err);
/* Drops every snapshot and block reference the cache holds. */
void qd_prefix_cache_free(qd_prefix_cache *pc);

typedef struct qd_prefix_hit {
    int n_tokens;            /* length of the hit (0: none); the snapshot covers tokens[0..n_tokens) */
    int n_matched;           /* tokens of the query present in the tree (>= n_tokens), snapshot or not */
    qd_prefix_tier tier;     /* where the snapshot is */
    const int32_t *blocks;   /* KV blocks covering tokens[0..n_tokens) */
    int n_blocks;
    const void *node;        /* for qd_prefix_cache_restore; valid until the next store or eviction */
} qd_prefix_hit;

/* Longest prefix of tokens[0..n) (n itself included) that has a snapshot under `key`,
 * in either tier; marks it most recently used. */
void qd_prefix_cache_lookup(qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, qd_prefix_hit *hit);
/* Sequence `seq` (whatever it held is released) becomes the hit's prefix: its GDN
 * state from the snapshot's tier, the hit's KV blocks shared. */
qd_status qd_prefix_cache_restore(qd_prefix_cache *pc, const qd_prefix_hit *hit, int seq);
/* Adds to the hit and query token counters (what the engine actually used). */
void qd_prefix_cache_count_query(qd_prefix_cache *pc, int query_tokens, int hit_tokens);

/* Stores sequence seq, which must hold exactly tokens[0..n) (its length is n; its KV
 * blocks covering them are referenced), as a snapshot of that prefix: into a device
 * slot, making room by moving or dropping the least recently used device snapshot;
 * straight to the host tier when the context has no slots. Then the budgets are
 * enforced (the new snapshot itself may move down or go when it alone is too large).
 * Returns 1 if a snapshot was stored, 0 when one of exactly that prefix exists (it
 * is marked used), when seq does not hold n tokens, on out of memory or a failed
 * copy (the cache is optional: nothing else changes). */
int qd_prefix_cache_store(qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, int seq);
/* KV blocks that only the cache holds: what evicting everything would give back to
 * the pool at most (so the engine does not empty the cache when that cannot help). */
int qd_prefix_cache_reclaimable_blocks(const qd_prefix_cache *pc);
/* Drops the least recently used snapshot of either tier (its blocks go back to the
 * pool when nobody else holds them); 0 when there is none. */
int qd_prefix_cache_evict_one(qd_prefix_cache *pc);

void qd_prefix_cache_get_stats(const qd_prefix_cache *pc, qd_prefix_cache_stats *out);

/* For tests: the depth (token count) of every snapshot node on the path of tokens,
 * written to depths[] (at most max), and its tier to tiers[] (may be NULL); returns
 * how many. Also checks the tree's invariants (depths, parent links, block counts,
 * tier lists, slot ownership, byte counts); returns -1 if one is broken. */
int qd_prefix_cache_check(const qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, int *depths,
                          qd_prefix_tier *tiers, int max);

#endif
