/* Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json`
 * (Qwen2/Qwen3/Qwen3-Next and Qwen3.5/3.6 vocabularies).
 *
 * Everything that differs between tokenizers (normalizer, split regex, vocab,
 * merges, added tokens and their flags) is read from the file; nothing about
 * Qwen is hard-coded. Supported components (anything else is rejected at load
 * with QD_ERR_UNSUPPORTED naming the component):
 *   normalizer:     null, NFC, NFD, NFKC, NFKD, Sequence of these
 *   pre_tokenizer:  ByteLevel (required somewhere), Split (Regex or String
 *                   pattern; behavior Isolated or Removed; invert false),
 *                   Sequence of these
 *   model:          BPE (merges as "a b" strings or [a, b] pairs; unk_token,
 *                   fuse_unk, ignore_merges; no dropout, no subword prefix/suffix)
 *   decoder:        ByteLevel (or null, treated the same)
 *   post_processor: ignored (Qwen adds no BOS/EOS; see add_special below)
 *
 * Encoding follows HF `tokenizers` exactly (the tests compare ids on thousands
 * of strings): added tokens are split off first (leftmost-longest, honouring
 * special/lstrip/rstrip/normalized/single_word), the remaining pieces are
 * normalized and pre-tokenized separately, each pre-token is BPE-merged
 * (lowest merge rank first, leftmost on ties).
 *
 * Invalid UTF-8 input policy: HF's Python API only accepts str, so bytes that
 * are not valid UTF-8 are first replaced the way Rust's String::from_utf8_lossy
 * and Python's bytes.decode("utf-8", "replace") do: every maximal invalid
 * subpart becomes one U+FFFD. Encoding invalid bytes therefore equals HF
 * encoding of the lossy-decoded string. Decoding ids applies the same rule to
 * its output (HF decode also ends in from_utf8_lossy), so decode output is
 * always valid UTF-8. Added tokens decode through the ByteLevel decoder as in
 * HF: content made only of byte-level alphabet characters is read as bytes,
 * so a non-ASCII added token such as "éé" decodes to U+FFFD U+FFFD (no
 * Qwen added token is affected: they are all ASCII).
 *
 * Ids come from the file: an added token keeps its "id" even where HF would
 * renumber it (HF assigns added ids sequentially after the model vocab and
 * only warns about a mismatch; real tokenizer files agree with that order).
 *
 * Thread safety: a loaded tokenizer is read-only except for a word cache that
 * is guarded by a mutex taken with trylock; any number of threads may encode
 * and decode with one tokenizer at the same time.
 */
#ifndef QD_IO_TOKENIZER_H
#define QD_IO_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef struct qd_tokenizer qd_tokenizer;

/* Loads a tokenizer.json file. On failure *out is NULL and err names the
 * file and the field that was wrong. */
qd_status qd_tokenizer_load(const char *tokenizer_json_path, qd_tokenizer **out, qd_err *err);
/* Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json for
 * eos_token and pad_token (a malformed tokenizer_config.json is an error, a
 * missing one is not). Added tokens and their flags come from tokenizer.json. */
qd_status qd_tokenizer_load_dir(const char *dir, qd_tokenizer **out, qd_err *err);
void qd_tokenizer_free(qd_tokenizer *tok);

/* One past the largest id (regular vocab plus added tokens). Ids in
 * [0, vocab_size) without a token (holes) decode to nothing. */
int32_t qd_tokenizer_vocab_size(const qd_tokenizer *tok);
/* Id of a token given as it is spelled in tokenizer.json (byte-level form for
 * regular tokens, e.g. "Ġthe"; content for added tokens, e.g. "<|im_end|>");
 * -1 when absent. */
int32_t qd_tokenizer_token_to_id(const qd_tokenizer *tok, const char *token);
/* The spelling of an id as in tokenizer.json, NUL-terminated, owned by the
 * tokenizer; NULL for ids out of range or holes. */
const char *qd_tokenizer_id_to_token(const qd_tokenizer *tok, int32_t id);
/* 1 for added tokens marked "special": true (skipped by decode with
 * skip_special), 0 otherwise (including out-of-range ids). */
int qd_tokenizer_is_special(const qd_tokenizer *tok, int32_t id);
/* 1 for any added token (special or not, e.g. <think>). */
int qd_tokenizer_is_added(const qd_tokenizer *tok, int32_t id);
/* eos_token from tokenizer_config.json (load_dir only), else -1. */
int32_t qd_tokenizer_eos_id(const qd_tokenizer *tok);
int32_t qd_tokenizer_pad_id(const qd_tokenizer *tok);

/* Growable id buffer; zero-initialise, free ids with free(). */
typedef struct qd_token_buf {
    int32_t *ids;
    size_t n, cap;
} qd_token_buf;

/* Appends the ids of text[0..len) to buf. add_special is accepted for API
 * symmetry with HF and ignored: Qwen tokenizers add no BOS/EOS. Text may
 * contain NUL bytes. On error buf keeps its previous contents. */
qd_status qd_tokenizer_encode_append(const qd_tokenizer *tok, const char *text, size_t len,
                                     int add_special, qd_token_buf *buf, qd_err *err);
/* Same, returning a fresh malloc'd array (free() it); *ids is NULL when *n is 0. */
qd_status qd_tokenizer_encode(const qd_tokenizer *tok, const char *text, size_t len,
                              int add_special, int32_t **ids, size_t *n, qd_err *err);

/* Decodes ids to UTF-8 (malloc'd, NUL-terminated, length in *len). With
 * skip_special, tokens marked special are left out (like HF
 * skip_special_tokens=True). Out-of-range ids are an error
 * (QD_ERR_INVALID_ARG). */
qd_status qd_tokenizer_decode(const qd_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                              char **out, size_t *len, qd_err *err);
/* The raw bytes of one token (byte-level mapping undone), not NUL-terminated,
 * may be an incomplete UTF-8 sequence; NULL for out-of-range ids. */
const unsigned char *qd_tokenizer_token_bytes(const qd_tokenizer *tok, int32_t id, size_t *len);

/* Streaming detokenizer: push ids one at a time, get back only complete UTF-8
 * characters; bytes of a character split over several tokens are held until
 * the character is complete. The concatenation of all chunks (pushes + flush)
 * equals qd_tokenizer_decode of the same ids. */
typedef struct qd_detok {
    const qd_tokenizer *tok;
    int skip_special;
    unsigned char pend[4];  /* an incomplete (so far valid) UTF-8 prefix */
    size_t n_pend;
    char *out;              /* chunk storage, reused between calls */
    size_t out_cap;
} qd_detok;

void qd_detok_init(qd_detok *d, const qd_tokenizer *tok, int skip_special);
/* *text (NUL-terminated, *len bytes, possibly 0) stays valid until the next
 * push/flush/free on d. */
qd_status qd_detok_push(qd_detok *d, int32_t id, const char **text, size_t *len, qd_err *err);
/* Emits what is still held (an incomplete sequence becomes U+FFFD) and resets
 * the state, so d can be reused for a new stream. */
qd_status qd_detok_flush(qd_detok *d, const char **text, size_t *len, qd_err *err);
void qd_detok_free(qd_detok *d);

/* Writes the lossy UTF-8 form of s[0..len) (each maximal invalid subpart
 * becomes U+FFFD) to a malloc'd NUL-terminated buffer. Returns NULL on OOM.
 * Exposed for tests and for callers that must print model output safely. */
char *qd_utf8_lossy(const unsigned char *s, size_t len, size_t *out_len);
/* 1 when s[0..len) is valid UTF-8 (no surrogates, no overlongs, <= U+10FFFF). */
int qd_utf8_valid(const unsigned char *s, size_t len);

#endif
