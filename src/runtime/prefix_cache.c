/* Prefix cache: radix tree over token ids, GDN snapshots and shared KV blocks at
 * chosen nodes, LRU eviction within a byte budget (see prefix_cache.h). */
#include "runtime/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "model/model.h"

typedef struct pc_node {
    struct pc_node *parent, *child, *sibling; /* children as a singly linked list */
    int32_t *tok;                             /* the edge's tokens, from the parent's end to ours */
    int n_tok;
    int depth;                                /* tokens from the root to the end of this node */
    void *snap;                               /* snapshot at depth, or NULL */
    int32_t *blocks;                          /* with snap: the blocks covering [0, depth) */
    int n_blocks;
    struct pc_node *lru_prev, *lru_next;      /* snapshot nodes, least recently used first */
} pc_node;

typedef struct pc_root {
    uint64_t key;
    pc_node *node;
} pc_root;

struct qd_prefix_cache {
    qd_context *ctx;
    size_t budget, snap_bytes, block_bytes;
    pc_root *roots;
    int n_roots;
    pc_node *lru_head, *lru_tail;
    int32_t *block_users; /* [pool blocks] cache nodes referencing each block: a block is counted once */
    int n_pool_blocks;
    qd_prefix_cache_stats st;
};

qd_status qd_prefix_cache_create(qd_context *ctx, size_t budget_bytes, size_t snapshot_bytes, size_t block_bytes,
                                 qd_prefix_cache **out, qd_err *err) {
    if (!out) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_prefix_cache_create: out is NULL");
    *out = NULL;
    if (snapshot_bytes < 8)
        return qd_seterr(err, QD_ERR_INVALID_ARG, "prefix cache: snapshot size %zu is too small", snapshot_bytes);
    qd_prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return qd_seterr(err, QD_ERR_OOM, "out of memory for the prefix cache");
    pc->ctx = ctx;
    pc->budget = budget_bytes;
    pc->snap_bytes = snapshot_bytes;
    pc->block_bytes = block_bytes;
    pc->n_pool_blocks = ctx ? qd_kv_total_blocks(ctx) : 0;
    if (pc->n_pool_blocks > 0) {
        pc->block_users = calloc((size_t)pc->n_pool_blocks, sizeof(int32_t));
        if (!pc->block_users) {
            int nb = pc->n_pool_blocks;
            free(pc);
            return qd_seterr(err, QD_ERR_OOM, "out of memory for the prefix cache's block table (%d blocks)", nb);
        }
    }
    pc->st.budget = budget_bytes;
    *out = pc;
    return QD_OK;
}

static void update_bytes(qd_prefix_cache *pc) {
    pc->st.bytes = (size_t)pc->st.snapshots * pc->snap_bytes + (size_t)pc->st.blocks * pc->block_bytes;
}

static void lru_unlink(qd_prefix_cache *pc, pc_node *n) {
    if (n->lru_prev) n->lru_prev->lru_next = n->lru_next;
    else pc->lru_head = n->lru_next;
    if (n->lru_next) n->lru_next->lru_prev = n->lru_prev;
    else pc->lru_tail = n->lru_prev;
    n->lru_prev = n->lru_next = NULL;
}

static void lru_push_tail(qd_prefix_cache *pc, pc_node *n) {
    n->lru_next = NULL;
    n->lru_prev = pc->lru_tail;
    if (pc->lru_tail) pc->lru_tail->lru_next = n;
    else pc->lru_head = n;
    pc->lru_tail = n;
}

static void touch(qd_prefix_cache *pc, pc_node *n) {
    lru_unlink(pc, n);
    lru_push_tail(pc, n);
}

/* Drops a node's snapshot and block references (the node stays). */
static void drop_snapshot(qd_prefix_cache *pc, pc_node *n) {
    if (!n->snap) return;
    lru_unlink(pc, n);
    for (int i = 0; i < n->n_blocks; i++) {
        int32_t b = n->blocks[i];
        if (--pc->block_users[b] == 0) pc->st.blocks--;
        qd_kv_block_unref(pc->ctx, b);
    }
    free(n->blocks);
    free(n->snap);
    n->blocks = NULL;
    n->snap = NULL;
    n->n_blocks = 0;
    pc->st.snapshots--;
    update_bytes(pc);
}

static void free_subtree(qd_prefix_cache *pc, pc_node *n) {
    while (n->child) {
        pc_node *c = n->child;
        n->child = c->sibling;
        free_subtree(pc, c);
    }
    drop_snapshot(pc, n);
    free(n->tok);
    free(n);
}

void qd_prefix_cache_free(qd_prefix_cache *pc) {
    if (!pc) return;
    for (int i = 0; i < pc->n_roots; i++) free_subtree(pc, pc->roots[i].node);
    free(pc->roots);
    free(pc->block_users);
    free(pc);
}

static pc_node *find_root(qd_prefix_cache *pc, uint64_t key, int create) {
    for (int i = 0; i < pc->n_roots; i++)
        if (pc->roots[i].key == key) return pc->roots[i].node;
    if (!create) return NULL;
    pc_root *r = realloc(pc->roots, sizeof *r * (size_t)(pc->n_roots + 1));
    if (!r) return NULL;
    pc->roots = r;
    pc_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    pc->roots[pc->n_roots++] = (pc_root){key, n};
    return n;
}

static pc_node *child_starting_with(const pc_node *n, int32_t t) {
    for (pc_node *c = n->child; c; c = c->sibling)
        if (c->tok[0] == t) return c;
    return NULL;
}

void qd_prefix_cache_lookup(qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, qd_prefix_hit *hit) {
    memset(hit, 0, sizeof *hit);
    pc_node *node = find_root(pc, key, 0), *best = NULL;
    int pos = 0;
    while (node && pos < n) {
        pc_node *c = child_starting_with(node, tokens[pos]);
        if (!c) break;
        int k = 0;
        while (k < c->n_tok && pos + k < n && c->tok[k] == tokens[pos + k]) k++;
        pos += k;
        if (k < c->n_tok) break; /* diverges (or the query ends) inside this edge */
        node = c;
        if (node->snap) best = node;
    }
    hit->n_matched = pos;
    if (!best) return;
    touch(pc, best);
    hit->n_tokens = best->depth;
    hit->snapshot = best->snap;
    hit->blocks = best->blocks;
    hit->n_blocks = best->n_blocks;
}

void qd_prefix_cache_count_query(qd_prefix_cache *pc, int query_tokens, int hit_tokens) {
    pc->st.query_tokens += (uint64_t)(query_tokens > 0 ? query_tokens : 0);
    pc->st.hit_tokens += (uint64_t)(hit_tokens > 0 ? hit_tokens : 0);
}

static pc_node *new_node(pc_node *parent, const int32_t *tok, int n_tok) {
    pc_node *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->tok = malloc(sizeof(int32_t) * (size_t)n_tok);
    if (!c->tok) {
        free(c);
        return NULL;
    }
    memcpy(c->tok, tok, sizeof(int32_t) * (size_t)n_tok);
    c->n_tok = n_tok;
    c->parent = parent;
    c->depth = parent->depth + n_tok;
    c->sibling = parent->child;
    parent->child = c;
    return c;
}

/* Splits c's edge after k tokens (0 < k < n_tok): a new node takes c's first k tokens
 * and becomes c's parent. Returns the new node, NULL on out of memory (no change). */
static pc_node *split(pc_node *c, int k) {
    pc_node *mid = calloc(1, sizeof *mid);
    int32_t *head = malloc(sizeof(int32_t) * (size_t)k);
    int32_t *tail = malloc(sizeof(int32_t) * (size_t)(c->n_tok - k));
    if (!mid || !head || !tail) {
        free(mid);
        free(head);
        free(tail);
        return NULL;
    }
    memcpy(head, c->tok, sizeof(int32_t) * (size_t)k);
    memcpy(tail, c->tok + k, sizeof(int32_t) * (size_t)(c->n_tok - k));
    pc_node *p = c->parent;
    /* mid replaces c among p's children */
    for (pc_node **pp = &p->child; *pp; pp = &(*pp)->sibling)
        if (*pp == c) {
            *pp = mid;
            break;
        }
    mid->sibling = c->sibling;
    mid->parent = p;
    mid->tok = head;
    mid->n_tok = k;
    mid->depth = p->depth + k;
    mid->child = c;
    c->sibling = NULL;
    c->parent = mid;
    free(c->tok);
    c->tok = tail;
    c->n_tok -= k;
    return mid;
}

/* The node ending exactly at tokens[0..n), created (with splits) if needed. */
static pc_node *node_at(pc_node *root, const int32_t *tokens, int n) {
    pc_node *node = root;
    int pos = 0;
    while (pos < n) {
        pc_node *c = child_starting_with(node, tokens[pos]);
        if (!c) return new_node(node, tokens + pos, n - pos);
        int k = 0;
        while (k < c->n_tok && pos + k < n && c->tok[k] == tokens[pos + k]) k++;
        if (k < c->n_tok) {
            pc_node *mid = split(c, k);
            if (!mid) return NULL;
            c = mid;
        }
        pos += k;
        node = c;
    }
    return node;
}

/* Removes nodes that hold nothing any more (no snapshot, no children), upwards, and
 * merges a snapshot-less node with its only child so that paths stay short. */
static void prune(qd_prefix_cache *pc, pc_node *n) {
    (void)pc;
    while (n->parent && !n->snap && !n->child) {
        pc_node *p = n->parent;
        for (pc_node **pp = &p->child; *pp; pp = &(*pp)->sibling)
            if (*pp == n) {
                *pp = n->sibling;
                break;
            }
        free(n->tok);
        free(n);
        n = p;
    }
    if (n->parent && !n->snap && n->child && !n->child->sibling) {
        pc_node *c = n->child;
        int32_t *t = malloc(sizeof(int32_t) * (size_t)(n->n_tok + c->n_tok));
        if (!t) return; /* merging is only tidying */
        memcpy(t, n->tok, sizeof(int32_t) * (size_t)n->n_tok);
        memcpy(t + n->n_tok, c->tok, sizeof(int32_t) * (size_t)c->n_tok);
        free(c->tok);
        c->tok = t;
        c->n_tok += n->n_tok;
        c->parent = n->parent;
        c->sibling = n->sibling;
        for (pc_node **pp = &n->parent->child; *pp; pp = &(*pp)->sibling)
            if (*pp == n) {
                *pp = c;
                break;
            }
        free(n->tok);
        free(n);
    }
}

void *qd_prefix_cache_insert(qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, const int32_t *blocks,
                             int n_blocks) {
    if (!pc || n < 1 || n_blocks < 0 || (n_blocks > 0 && !pc->ctx)) return NULL;
    pc_node *root = find_root(pc, key, 1);
    if (!root) return NULL;
    pc_node *node = node_at(root, tokens, n);
    if (!node) return NULL;
    if (node->snap) {
        touch(pc, node);
        return NULL;
    }
    node->snap = malloc(pc->snap_bytes);
    node->blocks = n_blocks ? malloc(sizeof(int32_t) * (size_t)n_blocks) : NULL;
    if (!node->snap || (n_blocks && !node->blocks)) {
        free(node->snap);
        free(node->blocks);
        node->snap = NULL;
        node->blocks = NULL;
        prune(pc, node);
        return NULL;
    }
    for (int i = 0; i < n_blocks; i++) {
        int32_t b = blocks[i];
        node->blocks[i] = b;
        if (pc->block_users[b]++ == 0) pc->st.blocks++;
        qd_kv_block_ref(pc->ctx, b);
    }
    node->n_blocks = n_blocks;
    lru_push_tail(pc, node);
    pc->st.snapshots++;
    pc->st.inserts++;
    update_bytes(pc);
    return node->snap;
}

int qd_prefix_cache_evict_one(qd_prefix_cache *pc) {
    pc_node *n = pc->lru_head;
    if (!n) return 0;
    drop_snapshot(pc, n);
    pc->st.evictions++;
    prune(pc, n);
    return 1;
}

int qd_prefix_cache_reclaimable_blocks(const qd_prefix_cache *pc) {
    int k = 0;
    if (!pc->ctx) return 0;
    for (int b = 0; b < pc->n_pool_blocks; b++)
        if (pc->block_users[b] > 0 && pc->ctx->kv.ref[b] == pc->block_users[b]) k++;
    return k;
}

void qd_prefix_cache_enforce_budget(qd_prefix_cache *pc) {
    while (pc->st.bytes > pc->budget && qd_prefix_cache_evict_one(pc)) {
    }
}

static int count_nodes(const pc_node *n) {
    int k = 0;
    for (const pc_node *c = n->child; c; c = c->sibling) k += 1 + count_nodes(c);
    return k;
}

void qd_prefix_cache_get_stats(const qd_prefix_cache *pc, qd_prefix_cache_stats *out) {
    *out = pc->st;
    out->nodes = 0;
    for (int i = 0; i < pc->n_roots; i++) out->nodes += count_nodes(pc->roots[i].node);
}

/* Recursive invariant check: depths add up, parents link back, children start with
 * distinct tokens, snapshot nodes hold exactly the blocks covering their depth. */
static int check_node(const qd_prefix_cache *pc, const pc_node *n, int *snaps) {
    if (n->snap) {
        (*snaps)++;
        if (pc->ctx && n->n_blocks != qd_kv_blocks_for(pc->ctx, n->depth)) return -1;
    }
    for (const pc_node *c = n->child; c; c = c->sibling) {
        if (c->parent != n || c->n_tok < 1 || c->depth != n->depth + c->n_tok) return -1;
        for (const pc_node *d = c->sibling; d; d = d->sibling)
            if (d->tok[0] == c->tok[0]) return -1;
        if (check_node(pc, c, snaps) < 0) return -1;
    }
    return 0;
}

int qd_prefix_cache_check(const qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, int *depths, int max) {
    int snaps = 0;
    for (int i = 0; i < pc->n_roots; i++)
        if (check_node(pc, pc->roots[i].node, &snaps) < 0) return -1;
    if (snaps != pc->st.snapshots) return -1;
    const pc_node *node = NULL;
    for (int i = 0; i < pc->n_roots; i++)
        if (pc->roots[i].key == key) node = pc->roots[i].node;
    int pos = 0, k_out = 0;
    while (node && pos < n) {
        const pc_node *c = child_starting_with(node, tokens[pos]);
        if (!c || pos + c->n_tok > n || memcmp(c->tok, tokens + pos, sizeof(int32_t) * (size_t)c->n_tok) != 0) break;
        pos += c->n_tok;
        node = c;
        if (node->snap && k_out < max) depths[k_out++] = node->depth;
    }
    return k_out;
}
