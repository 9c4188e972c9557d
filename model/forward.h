/*
 * model/forward.h — the batched forward pass.
 *
 * One call runs a batch of sequences through the model. Each sequence brings
 * its own new tokens (a prefill chunk or a single decode token), the position
 * of the first one (= tokens already in its KV) and its block table, which
 * must already cover positions [0, pos + n_tokens) with blocks the caller may
 * write. K/V of the new tokens are written into those blocks. A sequence's
 * logits never depend on what else shares the batch.
 */
#ifndef LLAMAD_MODEL_FORWARD_H
#define LLAMAD_MODEL_FORWARD_H

#include "kernels/backend.h"
#include "model/model.h"

struct fwd_seq {
	const int32_t *tokens;       /* new tokens */
	int n_tokens;
	int pos;                     /* position of tokens[0] */
	const int32_t *block_table;  /* covers [0, pos + n_tokens) */
	float *logits;               /* out: vocab floats of the last token, or NULL */
	int all_logits;              /* if set, logits holds n_tokens x vocab */
};

struct fwd;

/* Scratch for batches of up to max_tokens tokens (bigger calls are cut into
 * chunks). Returns NULL on ENOMEM. */
struct fwd *fwd_new(const struct model *m, struct backend *be, int max_tokens);
/* Free; accepts NULL. */
void fwd_free(struct fwd *f);

/* Run the batch. Returns 0, or -EINVAL for a token id out of range, a
 * position past the model's context or an empty sequence. */
int fwd_run(struct fwd *f, const struct kt_kv *kv, const struct fwd_seq *seqs, int n_seqs);

#endif
