/* The serving engine: continuous batching over one model.
 *
 * Requests are submitted from any thread; one engine thread runs steps. Each step
 * packs running sequences into one ragged batch for qd_forward (decode tokens of
 * running sequences plus prefill chunks of new ones, under a per-step token budget),
 * samples, and reports each sequence's new token through its callback.
 *
 * Memory is planned at creation: `max_num_seqs` GDN state slots (conv + recurrent
 * state of every GDN layer) and a paged KV cache of fixed-size blocks for the
 * attention layers. A request is admitted when a slot and enough blocks for its
 * prompt are free; when blocks run out during decode the newest running request is
 * preempted (its blocks and slot freed, to be recomputed from its tokens later). */
#ifndef QD_RUNTIME_ENGINE_H
#define QD_RUNTIME_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "qdelta.h"
#include "runtime/sampler.h"

typedef struct qd_constraint qd_constraint; /* runtime/grammar/constraint.h */

typedef struct qd_engine qd_engine;

typedef struct qd_engine_params {
    int max_num_seqs;       /* running sequences (GDN state slots) */
    int max_model_len;      /* prompt + generated tokens per request */
    int max_batch_tokens;   /* tokens per step (prefill chunks + decodes) */
    int kv_block_size;      /* tokens per KV block (0: 16) */
    int n_kv_blocks;        /* 0: enough for max_num_seqs x max_model_len */
    int max_waiting;        /* queued requests beyond which submit returns QD_ERR_CAPACITY */
    /* Prefix cache (prefix_cache.h): bytes of the device tier, i.e. GDN snapshots in
     * the backend's memory (GPU memory with the CUDA backend: that many bytes of
     * snapshot slots are planned with the context) plus the KV blocks they keep alive;
     * 0 turns the cache off. Snapshots are taken one token before the end of each
     * prompt (so an identical prompt recomputes only its last token and samples the
     * same first token), where a prompt leaves the cached path (the branch point of a
     * shared system prompt), at the request's snapshot_at, every
     * prefix_snapshot_interval prompt tokens (0: never) and when a request finishes
     * (so that a continuation hits). */
    size_t prefix_cache_bytes;
    int prefix_snapshot_interval;
    /* The optional second tier: host memory for snapshots moved out of the full device
     * tier (restored from there on a hit); 0: none, they are dropped. */
    size_t prefix_cache_host_bytes;
    /* Batch-invariant mode (qd_context_params.batch_invariant): a request's tokens are
     * exactly those it gets alone, whatever else runs beside it. Needs
     * max_batch_tokens >= 2 * QD_INVARIANT_ALIGN; prompts are cut into pieces only at
     * multiples of QD_INVARIANT_ALIGN, and the prefix cache snapshots and restores only
     * there (see scheduler.c). */
    int batch_invariant;
    /* Speculative decoding with the checkpoint's MTP head (spec_step.c): 1..4 draft
     * tokens per decode step, verified in the step's one forward beside everything else
     * (0: off). The output is what plain decoding gives: greedy token for token (bit for
     * bit in batch-invariant mode), sampled in distribution. A model without an MTP head
     * or a backend without the MTP forward fails qd_engine_create, saying which.
     * Constrained requests (a grammar) do not speculate. */
    int speculative_tokens;
    /* Drafts are the MTP head's argmax over token ids [0, N) only (0: the whole
     * vocabulary). The head's LM head then reads N of its rows (the 27B's is 2.4 GB over
     * 248k ids: the larger part of a draft step), at the price of never proposing a
     * rarer id; BPE vocabularies put their most frequent tokens first. The output is
     * unchanged: a draft only decides what the verify step tries. */
    int speculative_draft_vocab;
    /* Draft in every step. Otherwise (0) a step drafts only while the measured costs say
     * it pays (spec_policy.h): a verify span's rows against the tokens its drafts have been
     * yielding. Batch-invariant mode always drafts. */
    int speculative_always;
    /* A step with decodes in it takes only as many prompt tokens as keep its forward
     * within this many milliseconds by the engine's measured cost model (step_cost.h), and
     * at least QD_STEP_MIN_PROMPT, so that decode latency stays bounded while prompts
     * still advance; a step without decodes takes max_batch_tokens. 0: off (every step
     * fills max_batch_tokens). */
    double max_step_ms;
} qd_engine_params;

/* Prompt tokens a step under max_step_ms may always take: two alignment units, so that a
 * batch-invariant prompt piece (cut only at multiples of QD_INVARIANT_ALIGN, never leaving
 * one token) always fits. */
#define QD_STEP_MIN_PROMPT (2 * QD_INVARIANT_ALIGN)

qd_engine_params qd_engine_default_params(void);

/* Bounds of the per-request token lists (OpenAI allows 300 logit_bias entries). */
#define QD_MAX_LOGIT_BIAS 300
#define QD_MAX_STOP_TOKEN_IDS 64

typedef struct qd_logit_bias {
    int32_t id;   /* [0, vocab) */
    float bias;   /* added to the raw logit before sampling; [-100, 100] */
} qd_logit_bias;

typedef struct qd_request_params {
    qd_sampling_params sampling;
    int max_tokens;           /* >= 1 (>= 0 with prompt_logprobs) */
    bool ignore_eos;          /* else stop at the model's EOS ids (the EOS token is reported) */
    /* Prefix cache: also snapshot the prompt at this many tokens (0 or outside
     * [1, prompt length): no). A chat server passes the end of the conversation before
     * the template's generation prompt: the next turn re-renders this turn's reply and
     * generation prompt differently (e.g. without its <think> opener), so that is the
     * deepest position the next turn is sure to share. */
    int snapshot_at;
    /* Generated tokens before which the EOS ids and stop_token_ids cannot be sampled
     * (their logits are -inf until then; with ignore_eos the EOS ids are ordinary
     * tokens and stay unmasked); [0, max_tokens]. */
    int min_tokens;
    /* More ids that end the request like EOS (finish EOS; the token is reported), even
     * with ignore_eos: the caller asked for them by id. */
    int n_stop_token_ids;
    int32_t stop_token_ids[QD_MAX_STOP_TOKEN_IDS];
    /* Added to the logits before penalties and sampling (OpenAI logit_bias); the
     * reported logprobs are of the biased logits (the distribution sampled from). */
    int n_logit_bias;
    qd_logit_bias logit_bias[QD_MAX_LOGIT_BIAS];
    /* A grammar on the output (structured outputs, tool calls): its token mask is
     * applied to every logits row before sampling, and the kept token advances it.
     * Owned by the engine once qd_engine_submit succeeds (freed with the request);
     * the caller keeps it when submit fails. NULL: unconstrained. */
    qd_constraint *constraint;
    /* Also report each prompt token's logprob under the tokens before it, with the top
     * sampling.n_logprobs alternatives (OpenAI's echo with logprobs: how evaluation
     * harnesses score a text), in events before the first token (prompt_lp below). They
     * are the raw model's log-softmax over [0, vocab_limit), with no logit_bias or penalty.
     * Such a prompt is computed whole (the prefix cache is not consulted while positions
     * are left to report) and its ids must lie below sampling.vocab_limit. max_tokens may
     * then be 0: the request ends (LENGTH) once its prompt is in, with no token. */
    bool prompt_logprobs;
} qd_request_params;

typedef enum qd_finish_reason {
    QD_FINISH_NONE = 0,       /* not finished */
    QD_FINISH_LENGTH,         /* max_tokens or max_model_len reached */
    QD_FINISH_EOS,            /* an end-of-sequence token was sampled */
    QD_FINISH_STOP,           /* the callback asked to stop (e.g. a stop string) */
    QD_FINISH_CANCELLED,      /* qd_engine_cancel or engine shutdown */
    QD_FINISH_ERROR           /* the forward pass failed; message in the event */
} qd_finish_reason;

typedef struct qd_engine_event {
    uint64_t request_id;
    int has_token;            /* 1: `sample` holds a new token */
    qd_sample_result sample;  /* token, its logprob, top alternatives */
    qd_finish_reason finish;  /* != NONE on the request's last event */
    const char *error;        /* with QD_FINISH_ERROR */
    int prompt_tokens;
    int completion_tokens;
    /* With qd_request_params.prompt_logprobs, events with has_token = 0 carry prompt
     * positions [prompt_lp_at, prompt_lp_at + n_prompt_lp): prompt_lp[i] holds the token at
     * position prompt_lp_at + i, its log-softmax under the logits of the position before,
     * and the alternatives there. Position 0 has no such logits and is never reported.
     * They come in order, each position once, all before the first token; the array is
     * valid during the callback. NULL and 0 in every other event. */
    const qd_sample_result *prompt_lp;
    int prompt_lp_at, n_prompt_lp;
} qd_engine_event;

/* Called on the engine's reporting thread, once per generated token and once more
 * (or on the same event) when the request finishes; after the finishing event the
 * request is gone. The events of all requests come in the order the engine made them,
 * one at a time, while the engine runs its next step. Return nonzero to stop the
 * request (finish reason STOP): no token event follows, and the finishing event counts
 * the tokens delivered up to then; the engine ends the request at its next step
 * boundary (a step it took meanwhile is discarded). Must not block for long (the
 * engine waits for its callbacks one step behind) and must not call back into the
 * engine except qd_engine_cancel.
 *
 * Every accepted request gets exactly one finishing event (finish != NONE): on its
 * last token for LENGTH and EOS; as one more event with has_token = 0 for STOP
 * (after the event whose callback returned nonzero), CANCELLED and ERROR. Tokens
 * are reported once each, in order, also across preemptions. When the finishing
 * event arrives the request is already counted in requests_finished and a cancel
 * of its id is ignored. */
typedef int (*qd_engine_callback)(void *user, const qd_engine_event *ev);

qd_status qd_engine_create(qd_model *model, const qd_engine_params *params, qd_engine **out, qd_err *err);
/* Cancels everything still running (callbacks get CANCELLED), stops the thread, frees. */
void qd_engine_free(qd_engine *e);

/* Queues a request; the prompt is copied. QD_ERR_INVALID_ARG for bad params or token
 * ids, QD_ERR_CAPACITY when prompt + max_tokens > max_model_len or the queue is full.
 * (also when prompt + max_tokens alone would need more KV blocks than the pool has,
 * possible only with an explicit small n_kv_blocks). *request_id is written before
 * the request's first callback can run. */
qd_status qd_engine_submit(qd_engine *e, const int32_t *prompt, int n_prompt, const qd_request_params *params,
                           qd_engine_callback cb, void *user, uint64_t *request_id, qd_err *err);
/* n sequences of one prompt (OpenAI's n): the prompt is prefilled once, as the first
 * request; when it has its logits the context sequence is forked (qd_seq_fork: GDN
 * state copied, KV blocks shared) into a free slot for each of the others, which sample
 * their first token from the same row. Sequence i samples with seed params.seed + i
 * and reports through cb(users[i]); request_ids[i] is its id (each can be cancelled
 * alone). A sequence that finds no free slot at that moment is queued as an ordinary
 * request instead (the prefix cache, if on, then shares the prompt). With a
 * constraint, sequence i > 0 gets its own copy of it (qd_constraint_clone); the
 * caller's goes to the first. With prompt_logprobs,
 * the sequences that compute the prompt report its positions (the first, and any queued
 * as an ordinary request); the forked ones do not. 1 <= n <= QD_MAX_FORKS.
 * qd_engine_submit is the n = 1 case. */
#define QD_MAX_FORKS 128
qd_status qd_engine_submit_n(qd_engine *e, const int32_t *prompt, int n_prompt, const qd_request_params *params, int n,
                             qd_engine_callback cb, void *const *users, uint64_t *request_ids, qd_err *err);
/* Cancels a queued or running request; frees its slot and blocks at the next step
 * boundary at the latest. Unknown ids are ignored. Thread-safe. */
void qd_engine_cancel(qd_engine *e, uint64_t request_id);

typedef struct qd_engine_stats {
    int running, waiting;
    int slots_used, slots_total;
    int kv_blocks_used, kv_blocks_total;
    uint64_t requests_finished;
    uint64_t prompt_tokens_total, generated_tokens_total;
    uint64_t preemptions;
    uint64_t steps;
    /* Tokens scheduled into prefill spans: every prompt (or, after a preemption,
     * recomputed) token not restored from the prefix cache, counted when its step is
     * built. A step whose forward fails still counts its tokens, but its requests end
     * with an error, so their remaining prompt tokens are never scheduled: with
     * failures this is less than the prompt tokens (see bench/RESULTS.md). */
    uint64_t prefill_tokens_total;
    /* Tokens of constrained greedy requests decided by the forward's argmax under their
     * grammar's mask (no logits row copied, no host pass over it); the other constrained
     * tokens went through the host's mask and sampler. */
    uint64_t masked_rows_total;
    /* prefix cache (all 0 when off); query tokens: each admission's known tokens;
     * snapshots and bytes: both tiers (device: snapshots in the backend's memory and
     * the KV blocks the cache holds; host: the second tier); evictions: snapshots
     * dropped; spills: moved from the device tier to the host tier */
    uint64_t prefix_hit_tokens, prefix_query_tokens, prefix_evictions, prefix_spills, prefix_host_restores;
    int prefix_snapshots, prefix_blocks, prefix_device_snapshots, prefix_host_snapshots;
    size_t prefix_bytes, prefix_device_bytes, prefix_host_bytes;
    /* speculative decoding (all 0 when off): verify steps (one per speculating sequence
     * and step), draft tokens verified, of them accepted, and accepted by draft position
     * (accepted_at[i]: drafts kept at position i of a step; position i is reached only
     * when 0..i-1 were kept) */
    uint64_t spec_verify_steps, spec_draft_tokens, spec_accepted_tokens;
    uint64_t spec_accepted_at[4];
    /* steps whose speculating decodes did not draft because drafting would not have paid
     * (speculative_always off) */
    uint64_t spec_plain_steps;
    /* the MTP head's forward calls: each step that drafts makes K (its held pairs and the
     * first draft in one, where the step token budget holds them), a plain step whose
     * requests' held pairs would overflow one, a step with prompt chunks of speculating
     * requests one more (their rows), and a finishing request with held pairs one */
    uint64_t spec_mtp_forwards;
    /* wall seconds the engine thread spent in the steps' main forwards and in the MTP
     * head's forwards (drafts, prompt catch-up), each with the host work around it, and
     * in whole steps (those plus scheduling, sampling and reporting: step_seconds minus
     * the two is the host's own share; the rest of the thread's time it waited for work) */
    double forward_seconds, mtp_seconds, step_seconds;
    /* of those, the steps without a prompt token (only decodes and verify spans): their
     * count and their main and MTP forwards' seconds, what a decode step costs apart from
     * the prefill steps among them */
    uint64_t decode_steps;
    double decode_forward_seconds, decode_mtp_seconds;
    /* of the host's share: choosing each step's spans, and sampling, advancing and
     * queuing the events of its rows */
    double schedule_seconds, report_seconds;
    /* the requests' callbacks (where a server detokenizes and queues its output), on the
     * engine's reporting thread beside the steps; and the engine thread's waits for that
     * thread (it runs at most one step behind: a wait means reporting took longer than
     * the step after it) */
    double callback_seconds, report_wait_seconds;
    /* The step cost model (step_cost.h) as last fitted: forward ms = [0] + [1] x prompt
     * tokens + [2] x decode rows; all 0 while not ready */
    double step_cost_ms[3];
    int step_cost_ready;
    uint64_t bounded_steps; /* steps whose prompt tokens max_step_ms held below max_batch_tokens */
} qd_engine_stats;
void qd_engine_get_stats(qd_engine *e, qd_engine_stats *out);

#endif
