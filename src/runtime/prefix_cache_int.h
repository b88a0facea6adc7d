/* Prefix cache internals shared by prefix_tree.c (the radix tree over token ids) and
 * prefix_cache.c (snapshot tiers, LRU, budgets, the API of prefix_cache.h). */
#ifndef QD_RUNTIME_PREFIX_CACHE_INT_H
#define QD_RUNTIME_PREFIX_CACHE_INT_H

#include "runtime/prefix_cache.h"

typedef struct pc_node {
    struct pc_node *parent, *child, *sibling; /* children as a singly linked list */
    int32_t *tok;                             /* the edge's tokens, from the parent's end to ours */
    int n_tok;
    int depth;                                /* tokens from the root to the end of this node */
    qd_prefix_tier tier;                      /* where the snapshot at depth is; NONE: no snapshot */
    int slot;                                 /* DEVICE: the context's snapshot slot */
    void *host;                               /* HOST: a qd_seq_state_save image */
    int32_t *blocks;                          /* with a snapshot: the blocks covering [0, depth) */
    int n_blocks;
    uint64_t used;                            /* clock of the last store or hit (LRU across tiers) */
    struct pc_node *lru_prev, *lru_next;      /* its tier's list, least recently used first */
} pc_node;

typedef struct pc_root {
    uint64_t key;
    pc_node *node;
} pc_root;

typedef struct pc_list {
    pc_node *head, *tail;
} pc_list;

struct qd_prefix_cache {
    qd_context *ctx;
    qd_prefix_cache_params p;
    size_t slot_bytes, host_snap_bytes; /* one snapshot in each tier */
    pc_root *roots;
    int n_roots;
    pc_list lru[3];          /* by tier (index QD_TIER_NONE unused) */
    uint64_t clock;
    int *free_slots;         /* stack of the context's unused snapshot slots */
    int n_slots, n_free_slots;
    int32_t *block_users;    /* [pool blocks] cache nodes referencing each block: a block is counted once */
    int n_pool_blocks;
    qd_prefix_cache_stats st;
};

/* prefix_tree.c */
pc_node *pc_find_root(qd_prefix_cache *pc, uint64_t key, int create);
/* The deepest node with a snapshot on the path of tokens[0..n) (NULL: none) and, in
 * *matched, how many of those tokens the tree holds. */
pc_node *pc_deepest_snapshot(pc_node *root, const int32_t *tokens, int n, int *matched);
/* The node ending exactly at tokens[0..n), created (with splits) if needed; NULL on
 * out of memory. */
pc_node *pc_node_at(pc_node *root, const int32_t *tokens, int n);
/* Removes nodes that hold nothing any more, upwards from n (n may be freed). */
void pc_prune(pc_node *n);
int pc_count_nodes(const pc_node *n);
/* Depths add up, parents link back, children start with distinct tokens: 0, else -1. */
int pc_check_structure(const pc_node *n);

#endif
