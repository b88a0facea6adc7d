/* Internal layout of qd_tokenizer, shared by tokenizer.c (loading),
 * tokenizer_encode.c and tokenizer_decode.c. Not part of the API. */
#ifndef QD_IO_TOKENIZER_IMPL_H
#define QD_IO_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>

#include "io/tokenizer.h"

#define TK_MAX_STEPS 8

enum { TK_FLAG_PRESENT = 1, TK_FLAG_ADDED = 2, TK_FLAG_SPECIAL = 4 };

/* (left id, right id) -> (rank, merged id); open addressing, key UINT64_MAX = empty. */
typedef struct tk_merge_slot {
    uint64_t key;
    uint32_t rank;
    int32_t id;
} tk_merge_slot;

typedef enum { TK_PRE_SPLIT, TK_PRE_BYTELEVEL } tk_pre_kind;

typedef struct tk_pretok {
    tk_pre_kind kind;
    pcre2_code *re;        /* Split pattern, or ByteLevel's GPT-2 regex when use_regex */
    int remove_matches;    /* Split behavior Removed (else Isolated) */
    int add_prefix_space;  /* ByteLevel */
} tk_pretok;

typedef struct tk_added {
    int32_t id;
    uint32_t off, len;     /* pattern bytes in tok->added_pool (normalized form if normalized) */
    uint8_t single_word, lstrip, rstrip, normalized, special;
} tk_added;

/* Byte trie over added-token patterns; children of a node are a sorted run
 * of edges. Matching is leftmost-longest like HF's aho-corasick matcher. */
typedef struct tk_trie {
    uint32_t *first_edge;  /* per node: index of first edge */
    uint16_t *n_edges;     /* per node */
    int32_t *term;         /* per node: index into added[] ending here, -1 none */
    uint8_t *edge_byte;
    uint32_t *edge_to;
    uint32_t n_nodes;
    uint8_t first[256];    /* bytes that start some pattern */
    int empty;             /* no patterns at all */
} tk_trie;

/* Cache of BPE results for pre-tokens (by their bytes). */
typedef struct tk_cache_slot {
    uint64_t hash;         /* 0 = empty */
    uint32_t key_off;      /* in pool */
    uint32_t key_len;
    uint32_t ids_off;      /* in pool, int32 aligned */
    uint32_t n_ids;
} tk_cache_slot;

typedef struct tk_cache {
    tk_cache_slot *slots;
    uint32_t mask, used;
    unsigned char *pool;
    size_t pool_len, pool_cap;
} tk_cache;

struct qd_tokenizer {
    int32_t n_ids;                 /* max id + 1 */
    char *str_pool;                /* NUL-terminated spellings */
    uint32_t *str_off;             /* per id, UINT32_MAX for holes */
    unsigned char *byte_pool;      /* decoded bytes per id */
    uint32_t *byte_off, *byte_len;
    uint8_t *flags;                /* TK_FLAG_* per id */
    int32_t *str_hash;             /* spelling -> id, open addressing, -1 empty */
    uint32_t str_hash_mask;

    tk_merge_slot *merges;
    uint32_t merges_mask;
    size_t n_merges;
    int32_t byte_id[256];          /* id of each single byte, -1 when not in vocab */
    uint16_t byte_cp[256];         /* byte -> its byte-level alphabet code point */
    int32_t unk_id;
    int fuse_unk, ignore_merges;

    int n_norm;
    int norm_opts[TK_MAX_STEPS];   /* utf8proc option sets, applied in order */
    int n_pre;
    tk_pretok pre[TK_MAX_STEPS];

    int n_added;
    tk_added *added;
    char *added_pool;
    tk_trie trie_raw, trie_norm;   /* non-normalized / normalized added tokens */
    int any_special_flags;         /* some added token has lstrip/rstrip/single_word */

    int32_t eos_id, pad_id;

    pthread_mutex_t cache_mu;
    tk_cache cache;
};

/* tokenizer_unicode.c (generated): PCRE2 class bodies to add to \p{L}, \p{N}, \p{M}. */
extern const char tk_unicode_extra_L[], tk_unicode_extra_N[], tk_unicode_extra_M[];

/* tokenizer.c */
int32_t tk_lookup(const qd_tokenizer *tok, const char *s, size_t len);
uint64_t tk_hash_bytes(const void *p, size_t n);
qd_status tk_trie_build(tk_trie *t, const tk_added *added, int n_added, const char *pool, int normalized,
                        qd_err *err);
void tk_trie_free(tk_trie *t);

/* tokenizer_encode.c */
/* Applies the normalizer chain to s[0..len); *out is s itself (no copy) when
 * the text is already normalized, else a malloc'd buffer the caller frees. */
qd_status tk_normalize(const qd_tokenizer *tok, const unsigned char *s, size_t len, unsigned char **out,
                       size_t *out_len, int *owned, qd_err *err);
void tk_cache_free(tk_cache *c);

/* tokenizer_decode.c */
/* Length of the valid UTF-8 sequence at s (1..4), or 0 when s starts an
 * invalid one; *sub gets the length of the maximal invalid subpart then. */
size_t tk_utf8_seq(const unsigned char *s, size_t len, size_t *sub);
uint32_t tk_utf8_decode(const unsigned char *s, size_t n);

#endif
