/* The token mask of a grammar state by a trie walk over the state automaton
 * (token_trie.h, state_dfa.h). */
#include <stdlib.h>
#include <string.h>

#include "runtime/grammar/state_dfa.h"
#include "runtime/grammar/token_trie.h"

static void allow(uint32_t *mask, int id) { mask[id >> 5] |= 1u << (id & 31); }

int qd_token_trie_mask_dfa(const qd_token_trie *t, qd_state_dfa *d, int start, qd_trie_walk *w, int budget,
                           uint32_t *mask, int *max_dist_out) {
    memset(mask, 0, sizeof(uint32_t) * (((size_t)t->vocab_size + 31) / 32));
    return qd_token_trie_mask_dfa_add(t, d, start, w, budget, mask, max_dist_out);
}

/* The walk of qd_token_trie_mask_dfa_add; with root_at, a node of depth 1 is not a
 * byte but a start: its subtree is walked from state root_at[byte] (QD_DFA_DEAD, or
 * past n_root: skipped), and no token ends there. */
static int walk(const qd_token_trie *t, qd_state_dfa *d, int start, const int *root_at, int n_root, qd_trie_walk *w,
                int budget, uint32_t *mask, int *max_dist_out) {
    if (w->n_at_id < t->max_depth + 1) {
        int *a = realloc(w->at_id, sizeof(int) * (size_t)(t->max_depth + 1));
        if (!a) return -1;
        w->at_id = a;
        w->n_at_id = t->max_depth + 1;
    }
    int *at = w->at_id;
    at[0] = start;
    const int want_dist = budget >= 0 || max_dist_out != NULL;
    int max_dist = 0;
    const qd_trie_node *nd = t->nodes;
    int i = 1;
    while (i < t->n_nodes) {
        const qd_trie_node *n = &nd[i];
        const int dep = n->depth, from = at[dep - 1];
        if (root_at && dep == 1) {
            const int s = n->byte < n_root ? root_at[n->byte] : QD_DFA_DEAD;
            if (s < 0) {
                i = n->end;
                continue;
            }
            at[1] = s;
            i++;
            continue;
        }
        if (qd_state_dfa_loops_cats(d, from, n->sub_cats)) {
            /* every token below ends in `from` again: all allowed, or none by budget */
            const int dist = want_dist ? qd_state_dfa_dist(d, from) : 0;
            if (budget < 0 || dist <= budget) {
                d->subtree_skips++;
                for (int r = n->rank; r < nd[n->end].rank; r++) allow(mask, t->sorted_ids[r]);
                if (dist > max_dist) max_dist = dist;
            }
            i = n->end;
            continue;
        }
        const int to = qd_state_dfa_step(d, from, n->byte);
        if (to == QD_DFA_DEAD) {
            i = n->end;
            continue;
        }
        if (to == QD_DFA_FULL) return 1;
        at[dep] = to;
        if (nd[i + 1].rank > n->rank) {
            int ok = 1;
            if (want_dist) {
                const int dist = qd_state_dfa_dist(d, to);
                if (budget >= 0 && dist > budget) ok = 0;
                else if (dist > max_dist) max_dist = dist;
            }
            if (ok)
                for (int r = n->rank; r < nd[i + 1].rank; r++) allow(mask, t->sorted_ids[r]);
        }
        i++;
    }
    if (max_dist_out) *max_dist_out = max_dist;
    return 0;
}

int qd_token_trie_mask_dfa_add(const qd_token_trie *t, qd_state_dfa *d, int start, qd_trie_walk *w, int budget,
                               uint32_t *mask, int *max_dist_out) {
    return walk(t, d, start, NULL, 0, w, budget, mask, max_dist_out);
}

int qd_token_trie_mask_dfa_rooted(const qd_token_trie *t, qd_state_dfa *d, const int *root_at, int n_root,
                                  qd_trie_walk *w, int budget, uint32_t *mask, int *max_dist_out) {
    return walk(t, d, root_at[0], root_at, n_root, w, budget, mask, max_dist_out);
}
