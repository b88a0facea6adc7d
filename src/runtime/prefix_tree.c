/* The prefix cache's radix tree over token ids: one tree per model identity key,
 * edges labelled with token runs, split where two prefixes part and merged back when
 * a node in the middle of a path no longer holds a snapshot. What a node holds (its
 * snapshot, its blocks) is prefix_cache.c's business. */
#include <stdlib.h>
#include <string.h>

#include "runtime/prefix_cache_int.h"

pc_node *pc_find_root(qd_prefix_cache *pc, uint64_t key, int create) {
    for (int i = 0; i < pc->n_roots; i++)
        if (pc->roots[i].key == key) return pc->roots[i].node;
    if (!create) return NULL;
    pc_root *r = realloc(pc->roots, sizeof *r * (size_t)(pc->n_roots + 1));
    if (!r) return NULL;
    pc->roots = r;
    pc_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->slot = -1;
    pc->roots[pc->n_roots++] = (pc_root){key, n};
    return n;
}

static pc_node *child_starting_with(const pc_node *n, int32_t t) {
    for (pc_node *c = n->child; c; c = c->sibling)
        if (c->tok[0] == t) return c;
    return NULL;
}

pc_node *pc_deepest_snapshot(pc_node *node, const int32_t *tokens, int n, int *matched) {
    pc_node *best = NULL;
    int pos = 0;
    while (node && pos < n) {
        pc_node *c = child_starting_with(node, tokens[pos]);
        if (!c) break;
        int k = 0;
        while (k < c->n_tok && pos + k < n && c->tok[k] == tokens[pos + k]) k++;
        pos += k;
        if (k < c->n_tok) break; /* diverges (or the query ends) inside this edge */
        node = c;
        if (node->tier != QD_TIER_NONE) best = node;
    }
    *matched = pos;
    return best;
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
    c->slot = -1;
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
    mid->slot = -1;
    mid->child = c;
    c->sibling = NULL;
    c->parent = mid;
    free(c->tok);
    c->tok = tail;
    c->n_tok -= k;
    return mid;
}

pc_node *pc_node_at(pc_node *root, const int32_t *tokens, int n) {
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

static void unlink_child(pc_node *p, pc_node *n, pc_node *replacement) {
    for (pc_node **pp = &p->child; *pp; pp = &(*pp)->sibling)
        if (*pp == n) {
            *pp = replacement ? replacement : n->sibling;
            return;
        }
}

/* Removes nodes that hold nothing any more (no snapshot, no children), upwards, and
 * merges a snapshot-less node with its only child so that paths stay short. */
void pc_prune(pc_node *n) {
    while (n->parent && n->tier == QD_TIER_NONE && !n->child) {
        pc_node *p = n->parent;
        unlink_child(p, n, NULL);
        free(n->tok);
        free(n);
        n = p;
    }
    if (n->parent && n->tier == QD_TIER_NONE && n->child && !n->child->sibling) {
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
        unlink_child(n->parent, n, c);
        free(n->tok);
        free(n);
    }
}

int pc_count_nodes(const pc_node *n) {
    int k = 0;
    for (const pc_node *c = n->child; c; c = c->sibling) k += 1 + pc_count_nodes(c);
    return k;
}

int pc_check_structure(const pc_node *n) {
    for (const pc_node *c = n->child; c; c = c->sibling) {
        if (c->parent != n || c->n_tok < 1 || c->depth != n->depth + c->n_tok) return -1;
        for (const pc_node *d = c->sibling; d; d = d->sibling)
            if (d->tok[0] == c->tok[0]) return -1;
        if (pc_check_structure(c) < 0) return -1;
    }
    return 0;
}
