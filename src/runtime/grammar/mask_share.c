/* Masks shared by the constraints of one grammar (mask_share.h). */
#include "runtime/grammar/mask_share.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct share_entry {
    int valid;
    uint64_t hash;
    qd_mstate state;
    uint32_t *mask;
    int max_dist;
} share_entry;

struct qd_mask_share {
    pthread_mutex_t mu;
    int refs;
    size_t n_words;
    int cap, next;
    share_entry *e;  /* [cap] */
};

qd_mask_share *qd_mask_share_new(size_t n_words, int max_entries) {
    qd_mask_share *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cap = max_entries > 0 ? max_entries : 1;
    s->e = calloc((size_t)s->cap, sizeof *s->e);
    if (!s->e || pthread_mutex_init(&s->mu, NULL)) {
        free(s->e);
        free(s);
        return NULL;
    }
    for (int i = 0; i < s->cap; i++) qd_mstate_init(&s->e[i].state);
    s->refs = 1;
    s->n_words = n_words;
    return s;
}

qd_mask_share *qd_mask_share_ref(qd_mask_share *s) {
    if (s) __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
    return s;
}

int qd_mask_share_shared(const qd_mask_share *s) { return __atomic_load_n(&s->refs, __ATOMIC_RELAXED) > 1; }

void qd_mask_share_free(qd_mask_share *s) {
    if (!s || __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    for (int i = 0; i < s->cap; i++) {
        qd_mstate_free(&s->e[i].state);
        free(s->e[i].mask);
    }
    pthread_mutex_destroy(&s->mu);
    free(s->e);
    free(s);
}

/* The entry of st, or -1 (the mutex held). */
static int find(const qd_mask_share *s, const qd_mstate *st, uint64_t hash) {
    for (int i = 0; i < s->cap; i++)
        if (s->e[i].valid && s->e[i].hash == hash && qd_mstate_equal(&s->e[i].state, st)) return i;
    return -1;
}

int qd_mask_share_get(qd_mask_share *s, const qd_mstate *st, uint64_t hash, uint32_t *mask, int *max_dist) {
    pthread_mutex_lock(&s->mu);
    const int i = find(s, st, hash);
    if (i >= 0) {
        memcpy(mask, s->e[i].mask, sizeof(uint32_t) * s->n_words);
        *max_dist = s->e[i].max_dist;
    }
    pthread_mutex_unlock(&s->mu);
    return i >= 0;
}

int qd_mask_share_put(qd_mask_share *s, const qd_mstate *st, uint64_t hash, const uint32_t *mask, int max_dist) {
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (find(s, st, hash) < 0) {
        share_entry *e = &s->e[s->next];
        e->valid = 0;
        if (!e->mask) e->mask = malloc(sizeof(uint32_t) * s->n_words);
        if (!e->mask || qd_mstate_copy(&e->state, st)) rc = -1;
        else {
            memcpy(e->mask, mask, sizeof(uint32_t) * s->n_words);
            e->hash = hash;
            e->max_dist = max_dist;
            e->valid = 1;
            s->next = (s->next + 1) % s->cap;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}
