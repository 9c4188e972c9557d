/*
 * daemon/fair.h — how the rows of one batched step are shared among the
 * users who have work in it, so that one user's many generations do not
 * multiply another's latency.
 *
 * The engine's step runs every job's rows in one forward pass, and a
 * user's next token waits for the whole pass: with one user's 64
 * generations beside another's one, the other's tokens took 57 times as
 * long. Rows do not cost alike: a row's work is its matrix products (and
 * the classifier and sampling for a row that wants logits) plus its
 * attention over every position before it, so a row at position 250 of a
 * small model costs more than one at position 20. Each row's work comes
 * from the model's shape (fair_shape); what work costs in time is learnt
 * from the steps (fair_cost: step seconds = a + k1 x products + k2 x
 * attention, forgetting slowly; a is what a step costs whatever its rows,
 * on a GPU most of it).
 *
 * When two users or more have work, a step is kept within FAIR_FACTOR
 * times the time of a step of the cheapest row alone, and that time is
 * dealt out by deficit round robin (fair_pick): each step every user with
 * work gets an equal quantum of credit, and takes rows while its credit
 * covers their cost, users in turn. A user whose rows are cheap gets a
 * row every step; one whose rows cost five quanta gets a row every fifth
 * step; where rows are nearly free beside a (a large model reading its
 * weights once for all rows), every user gets many. One user alone has
 * every row, as before.
 *
 * Pure arithmetic: tests/unit/test_fair.c.
 */
#ifndef LLAMAD_DAEMON_FAIR_H
#define LLAMAD_DAEMON_FAIR_H

#include <stdint.h>

#define FAIR_FACTOR 2.0
/* One user alone: a step within FAIR_SOLO_FACTOR times the cheapest row's
 * step, or FAIR_SOLO_S seconds if more, so that a request arriving from
 * another user waits little for the step under way (one user's 64 rows of
 * a small model took 2.5 ms: a newcomer's first token waited for them),
 * while batching stays where it pays (a large model's decode). Until the
 * step's fixed part a is known, one user's steps are not cut, and every
 * FAIR_PROBE-th step runs half its rows, so that it comes to be known. */
#define FAIR_SOLO_FACTOR 8.0
#define FAIR_SOLO_S 1e-3
#define FAIR_PROBE 32

/* The work of a row, in MFLOP: row (its products), per_pos (attention,
 * for each position before it), logits (the classifier and sampling). */
struct fair_shape {
	double row, per_pos, logits;
};

/* The shape of a Llama model: dim, layers, heads, kv heads, head_dim,
 * ffn_dim, vocab. */
struct fair_shape fair_shape_of(int dim, int n_layers, int n_heads, int n_kv_heads, int head_dim,
				int ffn_dim, int vocab);

/* Step times by work, weighted by recency: x1, a step's row work (its
 * rows' products and classifier), x2, its attention work (per_pos x the
 * positions its rows look back on), t its seconds. Zeroed: nothing seen.
 * The two are fitted apart: attention over a long history reads the K/V
 * cache, and costs more a MFLOP than the products do. */
struct fair_cost {
	double n, x1, x2, t, x11, x12, x22, x1t, x2t;
};

/* A step of row work x1 and attention work x2 (MFLOP) took seconds. */
void fair_observe(struct fair_cost *c, double x1, double x2, double seconds);

/* Enough steps seen to predict (fair_pick needs a line). */
int fair_known(const struct fair_cost *c);

/* The plane: a step takes a + k1 x1 + k2 x2 seconds (a >= 0, k1 > 0,
 * k2 >= 0). Where the steps seen do not tell the three apart (their work
 * hardly varied), a is taken as 0 (the cautious reading: all of the cost
 * is the rows'), and where attention's share cannot be told either, both
 * works cost alike. 1 when a was told apart, else 0. */
int fair_line(const struct fair_cost *c, double *a, double *k1, double *k2);

/* A user with work, and its credit (seconds) from step to step. */
struct fair_user {
	uint32_t uid;
	double credit;
};

/* A job's rows this step: its user (an index into the users), the rows
 * it wants, the cost of its first (seconds) and how much each next one
 * costs more; take: the rows given (fair_pick's answer). */
struct fair_job {
	int user;
	int want;
	double cost0, dcost;
	int take;
};

/*
 * Deal one step's rows among n_users users by deficit round robin: the
 * step's time beyond a, (FAIR_FACTOR - 1) a + FAIR_FACTOR x the cheapest
 * first row, is each user's quantum times n_users (one user: the
 * FAIR_SOLO_FACTOR step, at least FAIR_SOLO_S); credit is capped (a user idle in rows does not bank time);
 * users take a row each in turn, from user `turn` on, round after round,
 * each from its jobs in the order given, while its credit covers its next
 * row; at most row_cap rows in all. When no user's credit covers a row,
 * the user with the most credit takes one. Sets jobs[].take; returns the
 * rows given.
 */
int fair_pick(struct fair_user *users, int n_users, struct fair_job *jobs, int n_jobs, double a,
	      int row_cap, unsigned turn);

#endif
