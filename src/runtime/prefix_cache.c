/* Prefix cache: GDN snapshots and shared KV blocks at chosen nodes of the radix tree
 * (prefix_tree.c), in two tiers (the context's snapshot slots, then host memory),
 * least recently used first out of each within its byte budget (see prefix_cache.h). */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "runtime/prefix_cache_int.h"

qd_status qd_prefix_cache_create(qd_context *ctx, const qd_prefix_cache_params *params, qd_prefix_cache **out,
                                 qd_err *err) {
    if (!out) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_prefix_cache_create: out is NULL");
    *out = NULL;
    if (!ctx || !params) return qd_seterr(err, QD_ERR_INVALID_ARG, "qd_prefix_cache_create: context or params is NULL");
    qd_prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return qd_seterr(err, QD_ERR_OOM, "out of memory for the prefix cache");
    pc->ctx = ctx;
    pc->p = *params;
    pc->slot_bytes = qd_snap_slot_bytes(ctx);
    pc->host_snap_bytes = qd_seq_state_size(ctx);
    pc->n_slots = qd_snap_slots(ctx);
    pc->n_pool_blocks = qd_kv_total_blocks(ctx);
    pc->free_slots = malloc(sizeof(int) * (size_t)(pc->n_slots > 0 ? pc->n_slots : 1));
    pc->block_users = calloc((size_t)(pc->n_pool_blocks > 0 ? pc->n_pool_blocks : 1), sizeof(int32_t));
    if (!pc->free_slots || !pc->block_users) {
        qd_prefix_cache_free(pc);
        return qd_seterr(err, QD_ERR_OOM, "out of memory for the prefix cache's tables (%d slots, %d blocks)",
                         qd_snap_slots(ctx), qd_kv_total_blocks(ctx));
    }
    /* slot 0 on top, so that a fresh cache fills the slots in order */
    for (int i = 0; i < pc->n_slots; i++) pc->free_slots[i] = pc->n_slots - 1 - i;
    pc->n_free_slots = pc->n_slots;
    pc->st.budget = params->device_bytes;
    pc->st.host_budget = params->host_bytes;
    *out = pc;
    return QD_OK;
}

static void update_bytes(qd_prefix_cache *pc) {
    qd_prefix_cache_stats *s = &pc->st;
    s->snapshots = s->device_snapshots + s->host_snapshots;
    s->device_bytes = (size_t)s->device_snapshots * pc->slot_bytes + (size_t)s->blocks * pc->p.block_bytes;
    s->host_bytes = (size_t)s->host_snapshots * pc->host_snap_bytes;
    s->bytes = s->device_bytes + s->host_bytes;
}

/* ------------------------------------------------------------------ LRU */

static void lru_unlink(qd_prefix_cache *pc, pc_node *n) {
    pc_list *l = &pc->lru[n->tier];
    if (n->lru_prev) n->lru_prev->lru_next = n->lru_next;
    else l->head = n->lru_next;
    if (n->lru_next) n->lru_next->lru_prev = n->lru_prev;
    else l->tail = n->lru_prev;
    n->lru_prev = n->lru_next = NULL;
}

/* Into its tier's list by its clock: lists stay ordered, least recently used first,
 * also when a snapshot moves down to a tier whose entries were used more recently. */
static void lru_insert(qd_prefix_cache *pc, pc_node *n) {
    pc_list *l = &pc->lru[n->tier];
    pc_node *after = l->tail;
    while (after && after->used > n->used) after = after->lru_prev;
    n->lru_prev = after;
    n->lru_next = after ? after->lru_next : l->head;
    if (n->lru_next) n->lru_next->lru_prev = n;
    else l->tail = n;
    if (after) after->lru_next = n;
    else l->head = n;
}

static void touch(qd_prefix_cache *pc, pc_node *n) {
    lru_unlink(pc, n);
    n->used = ++pc->clock;
    lru_insert(pc, n);
}

/* ------------------------------------------------------- tier movements */

/* Drops a node's snapshot and block references (the node stays). */
static void drop_snapshot(qd_prefix_cache *pc, pc_node *n) {
    if (n->tier == QD_TIER_NONE) return;
    lru_unlink(pc, n);
    if (n->tier == QD_TIER_DEVICE) {
        pc->free_slots[pc->n_free_slots++] = n->slot;
        pc->st.device_snapshots--;
    } else {
        free(n->host);
        pc->st.host_snapshots--;
    }
    n->tier = QD_TIER_NONE;
    n->slot = -1;
    n->host = NULL;
    for (int i = 0; i < n->n_blocks; i++) {
        int32_t b = n->blocks[i];
        if (--pc->block_users[b] == 0) pc->st.blocks--;
        qd_kv_block_unref(pc->ctx, b);
    }
    free(n->blocks);
    n->blocks = NULL;
    n->n_blocks = 0;
    update_bytes(pc);
}

/* Drops n's snapshot for good and tidies the tree (n may be freed). */
static void evict(qd_prefix_cache *pc, pc_node *n) {
    drop_snapshot(pc, n);
    pc->st.evictions++;
    pc_prune(n);
}

/* Evicts host snapshots, least recently used first, until one more fits the host
 * budget; 0 when the host tier cannot hold one at all. Never frees a node that holds
 * a snapshot (pruning only removes empty nodes). */
static int host_room(qd_prefix_cache *pc) {
    if (pc->host_snap_bytes > pc->p.host_bytes) return 0;
    while (pc->st.host_bytes + pc->host_snap_bytes > pc->p.host_bytes && pc->lru[QD_TIER_HOST].head)
        evict(pc, pc->lru[QD_TIER_HOST].head);
    return 1;
}

/* A device snapshot moves to the host tier (its blocks stay referenced), or, when the
 * host tier cannot take it, is dropped. Either way its slot is free afterwards. */
static void demote(qd_prefix_cache *pc, pc_node *n) {
    void *buf = host_room(pc) ? malloc(pc->host_snap_bytes) : NULL;
    if (!buf || qd_snap_to_host(pc->ctx, n->slot, n->depth, buf, pc->host_snap_bytes) != QD_OK) {
        free(buf);
        evict(pc, n);
        return;
    }
    lru_unlink(pc, n);
    pc->free_slots[pc->n_free_slots++] = n->slot;
    n->slot = -1;
    n->host = buf;
    n->tier = QD_TIER_HOST;
    lru_insert(pc, n);
    pc->st.device_snapshots--;
    pc->st.host_snapshots++;
    pc->st.spills++;
    update_bytes(pc);
}

/* Over the device budget, device snapshots move down (or go) least recently used
 * first; when only blocks are left to blame, host snapshots go, which releases their
 * blocks. Then the host budget. */
static void enforce_budgets(qd_prefix_cache *pc) {
    while (pc->st.device_bytes > pc->p.device_bytes) {
        if (pc->lru[QD_TIER_DEVICE].head) demote(pc, pc->lru[QD_TIER_DEVICE].head);
        else if (pc->lru[QD_TIER_HOST].head) evict(pc, pc->lru[QD_TIER_HOST].head);
        else break;
    }
    while (pc->st.host_bytes > pc->p.host_bytes && pc->lru[QD_TIER_HOST].head) evict(pc, pc->lru[QD_TIER_HOST].head);
}

/* ------------------------------------------------------------------ API */

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
    free(pc->free_slots);
    free(pc->block_users);
    free(pc);
}

void qd_prefix_cache_lookup(qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, qd_prefix_hit *hit) {
    memset(hit, 0, sizeof *hit);
    pc_node *root = pc_find_root(pc, key, 0);
    pc_node *best = root ? pc_deepest_snapshot(root, tokens, n, &hit->n_matched) : NULL;
    if (!best) return;
    touch(pc, best);
    hit->n_tokens = best->depth;
    hit->tier = best->tier;
    hit->blocks = best->blocks;
    hit->n_blocks = best->n_blocks;
    hit->node = best;
}

qd_status qd_prefix_cache_restore(qd_prefix_cache *pc, const qd_prefix_hit *hit, int seq) {
    const pc_node *n = hit ? hit->node : NULL;
    if (!n || n->tier == QD_TIER_NONE)
        return qd_seterr(&pc->ctx->err, QD_ERR_INVALID_ARG, "prefix cache: restoring a hit that holds no snapshot");
    if (n->tier == QD_TIER_DEVICE) return qd_snap_attach(pc->ctx, seq, n->slot, n->depth, n->blocks, n->n_blocks);
    pc->st.host_restores++;
    return qd_seq_state_attach(pc->ctx, seq, n->host, pc->host_snap_bytes, n->blocks, n->n_blocks);
}

void qd_prefix_cache_count_query(qd_prefix_cache *pc, int query_tokens, int hit_tokens) {
    pc->st.query_tokens += (uint64_t)(query_tokens > 0 ? query_tokens : 0);
    pc->st.hit_tokens += (uint64_t)(hit_tokens > 0 ? hit_tokens : 0);
}

int qd_prefix_cache_store(qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, int seq) {
    qd_context *ctx = pc ? pc->ctx : NULL;
    if (!ctx || n < 1 || seq < 0 || seq >= ctx->params.max_seqs) return 0;
    const qd_seq_blocks *q = &ctx->seqs[seq];
    const int nb = qd_kv_blocks_for(ctx, n);
    if (q->length != n || q->n_blocks < nb) return 0; /* never store a state that does not match its tokens */
    pc_node *root = pc_find_root(pc, key, 1);
    if (!root) return 0;
    int matched;
    pc_node *have = pc_deepest_snapshot(root, tokens, n, &matched);
    if (have && have->depth == n) {
        touch(pc, have);
        return 0;
    }
    /* room first: making it may prune empty nodes, which must not include ours */
    const int to_device = pc->n_slots > 0;
    if (to_device && pc->n_free_slots == 0) demote(pc, pc->lru[QD_TIER_DEVICE].head);
    if (!to_device && !host_room(pc)) return 0;
    pc_node *node = pc_node_at(root, tokens, n);
    if (!node) return 0;
    int32_t *blocks = nb ? malloc(sizeof(int32_t) * (size_t)nb) : NULL;
    void *host = to_device ? NULL : malloc(pc->host_snap_bytes);
    int slot = -1;
    qd_status st = QD_ERR_OOM;
    if ((!nb || blocks) && (to_device || host)) {
        if (to_device) {
            slot = pc->free_slots[--pc->n_free_slots];
            st = qd_snap_save(ctx, seq, slot);
            if (st != QD_OK) pc->free_slots[pc->n_free_slots++] = slot;
        } else {
            st = qd_seq_state_save(ctx, seq, host, pc->host_snap_bytes);
        }
    }
    if (st != QD_OK) {
        free(blocks);
        free(host);
        pc_prune(node);
        return 0;
    }
    for (int i = 0; i < nb; i++) {
        const int32_t b = q->blocks[i];
        blocks[i] = b;
        if (pc->block_users[b]++ == 0) pc->st.blocks++;
        qd_kv_block_ref(ctx, b);
    }
    node->blocks = blocks;
    node->n_blocks = nb;
    node->tier = to_device ? QD_TIER_DEVICE : QD_TIER_HOST;
    node->slot = slot;
    node->host = host;
    node->used = ++pc->clock;
    lru_insert(pc, node);
    if (to_device) pc->st.device_snapshots++;
    else pc->st.host_snapshots++;
    pc->st.inserts++;
    update_bytes(pc);
    enforce_budgets(pc);
    return 1;
}

int qd_prefix_cache_evict_one(qd_prefix_cache *pc) {
    pc_node *d = pc->lru[QD_TIER_DEVICE].head, *h = pc->lru[QD_TIER_HOST].head;
    pc_node *n = !d ? h : !h ? d : h->used < d->used ? h : d;
    if (!n) return 0;
    evict(pc, n);
    return 1;
}

int qd_prefix_cache_reclaimable_blocks(const qd_prefix_cache *pc) {
    int k = 0;
    for (int b = 0; b < pc->n_pool_blocks; b++)
        if (pc->block_users[b] > 0 && pc->ctx->kv.ref[b] == pc->block_users[b]) k++;
    return k;
}

void qd_prefix_cache_get_stats(const qd_prefix_cache *pc, qd_prefix_cache_stats *out) {
    *out = pc->st;
    out->nodes = 0;
    for (int i = 0; i < pc->n_roots; i++) out->nodes += pc_count_nodes(pc->roots[i].node);
}

/* ---------------------------------------------------------------- checks */

typedef struct check_acc {
    int dev, host;
    char *slot_seen; /* [n_slots] */
} check_acc;

/* Each snapshot node holds exactly the blocks covering its depth and one tier's
 * storage (a slot nobody else holds, or a host image). */
static int check_nodes(const qd_prefix_cache *pc, const pc_node *n, check_acc *a) {
    if (n->tier != QD_TIER_NONE) {
        if (n->n_blocks != qd_kv_blocks_for(pc->ctx, n->depth)) return -1;
        if (n->tier == QD_TIER_DEVICE) {
            if (n->slot < 0 || n->slot >= pc->n_slots || a->slot_seen[n->slot] || n->host) return -1;
            a->slot_seen[n->slot] = 1;
            a->dev++;
        } else {
            if (!n->host || n->slot != -1) return -1;
            a->host++;
        }
    } else if (n->slot != -1 || n->host || n->n_blocks) {
        return -1;
    }
    for (const pc_node *c = n->child; c; c = c->sibling)
        if (check_nodes(pc, c, a) < 0) return -1;
    return 0;
}

/* A tier's list: every entry of that tier, ordered by clock, linked both ways. */
static int check_list(const qd_prefix_cache *pc, qd_prefix_tier t, int want) {
    int k = 0;
    const pc_node *prev = NULL;
    for (const pc_node *n = pc->lru[t].head; n; prev = n, n = n->lru_next, k++)
        if (n->tier != t || n->lru_prev != prev || (prev && prev->used > n->used) || k > want) return -1;
    return k == want && pc->lru[t].tail == prev ? 0 : -1;
}

int qd_prefix_cache_check(const qd_prefix_cache *pc, uint64_t key, const int32_t *tokens, int n, int *depths,
                          qd_prefix_tier *tiers, int max) {
    check_acc a = {0, 0, calloc((size_t)(pc->n_slots > 0 ? pc->n_slots : 1), 1)};
    if (!a.slot_seen) return -1;
    int bad = 0;
    for (int i = 0; i < pc->n_roots && !bad; i++)
        bad = pc_check_structure(pc->roots[i].node) < 0 || check_nodes(pc, pc->roots[i].node, &a) < 0;
    for (int i = 0; i < pc->n_free_slots && !bad; i++) {
        const int s = pc->free_slots[i];
        bad = s < 0 || s >= pc->n_slots || a.slot_seen[s];
        if (!bad) a.slot_seen[s] = 1;
    }
    free(a.slot_seen);
    if (bad || a.dev != pc->st.device_snapshots || a.host != pc->st.host_snapshots ||
        a.dev + pc->n_free_slots != pc->n_slots || check_list(pc, QD_TIER_DEVICE, a.dev) < 0 ||
        check_list(pc, QD_TIER_HOST, a.host) < 0)
        return -1;
    const size_t dev_b = (size_t)a.dev * pc->slot_bytes + (size_t)pc->st.blocks * pc->p.block_bytes;
    if (pc->st.device_bytes != dev_b || pc->st.host_bytes != (size_t)a.host * pc->host_snap_bytes) return -1;
    const pc_node *node = NULL;
    for (int i = 0; i < pc->n_roots; i++)
        if (pc->roots[i].key == key) node = pc->roots[i].node;
    int pos = 0, k_out = 0;
    while (node && pos < n) {
        const pc_node *c = node->child;
        while (c && c->tok[0] != tokens[pos]) c = c->sibling;
        if (!c || pos + c->n_tok > n || memcmp(c->tok, tokens + pos, sizeof(int32_t) * (size_t)c->n_tok) != 0) break;
        pos += c->n_tok;
        node = c;
        if (node->tier != QD_TIER_NONE && k_out < max) {
            if (tiers) tiers[k_out] = node->tier;
            depths[k_out++] = node->depth;
        }
    }
    return k_out;
}
