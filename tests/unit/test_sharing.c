/*
 * tests/unit/test_sharing.c — prefix sharing between sessions
 * (session/session.c over session/kvpool.c's block names): which blocks
 * sess_share_prefix takes (whole blocks before the one holding the last
 * token, same owner, template and model), sess_name_blocks giving up a
 * block for an equal one already named, the chain cut by every edit of a
 * history, forks, sess_uid_blocks and the chain's definition.
 *
 * "Prefilling" a session is simulated as the engine does it: kvseq_prepare
 * from its cached tokens on, K/V written, n_cached moved, sess_name_blocks.
 * The K/V written into a block is a function of every token up to the
 * block's end (as a model's is), so a session that ends up on a block made
 * from other tokens holds visibly wrong K/V.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include "session/session.h"

#define NB 64      /* blocks */
#define BS 8       /* positions per block */
#define NL 1       /* layers */
#define KVD 4      /* kv_dim */
#define BASE 0x5eed0001ull
#define UID 1000

struct fx {
	struct kvpool *pool;
	struct sess_table st;
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	if (!f)
		return -1;
	f->pool = kvpool_new(NB, BS, NL, KVD);
	if (!f->pool || sess_table_init(&f->st, f->pool) != 0)
		return -1;
	sess_set_sharing(&f->st, 1, BASE);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	sess_table_done(&f->st);
	/* every block back, and the free structures whole */
	assert_int_equal(kvpool_n_free(f->pool), NB);
	assert_int_equal(f->pool->n_plain + f->pool->n_lru, NB);
	kvpool_free(f->pool);
	free(f);
	return 0;
}

/* ---- helpers -------------------------------------------------------- */

/* t[i] = base + i */
static void run_of(int32_t *t, int n, int32_t base)
{
	for (int i = 0; i < n; i++)
		t[i] = base + i;
}

/* A session of uid with the tokens t (one user turn). */
static struct session *mk(struct fx *f, uid_t uid, const char *id, const int32_t *t, int n)
{
	struct session *s = sess_create(&f->st, uid, id);
	assert_non_null(s);
	assert_int_equal(sess_append(s, t, n, CHAT_USER, NULL, 1), 0);
	return s;
}

/* What a model's K/V for positions up to end would depend on. */
static uint64_t kv_key(const int32_t *t, int end)
{
	return XXH64(t, (size_t)end * sizeof(int32_t), 0x6b76);
}

static float kv_val(uint64_t key, size_t j)
{
	return (float)((key >> (j % 40)) & 0xfff) + (float)j;
}

static void block_write(struct fx *f, int32_t b, uint64_t key)
{
	float *x = kvpool_host_block(f->pool, b);
	size_t n = kt_kv_block_bytes(&f->pool->kv) / sizeof(float);
	for (size_t j = 0; j < n; j++)
		x[j] = kv_val(key, j);
}

static int block_holds(struct fx *f, int32_t b, uint64_t key)
{
	const float *x = kvpool_host_block(f->pool, b);
	size_t n = kt_kv_block_bytes(&f->pool->kv) / sizeof(float);
	for (size_t j = 0; j < n; j++)
		if (x[j] != kv_val(key, j))
			return 0;
	return 1;
}

static int min_i(int a, int b)
{
	return a < b ? a : b;
}

/* Run s's pending tokens through the "model", as the engine's step does. */
static void prefill(struct fx *f, struct session *s)
{
	assert_int_equal(kvseq_prepare(f->pool, &s->kv, s->n_tokens, s->n_cached), 0);
	for (int i = s->n_cached / BS; i < s->kv.n_blocks; i++)
		block_write(f, s->kv.blocks[i], kv_key(s->tokens, min_i(s->n_tokens, (i + 1) * BS)));
	s->n_cached = s->n_tokens;
	sess_name_blocks(&f->st, s);
}

/* Every cached block of s holds the K/V of s's own tokens. */
static void check_kv(struct fx *f, const struct session *s)
{
	assert_true(s->kv.n_blocks >= (s->n_cached + BS - 1) / BS);
	for (int i = 0; i < (s->n_cached + BS - 1) / BS; i++)
		assert_true(block_holds(f, s->kv.blocks[i],
					kv_key(s->tokens, min_i(s->n_tokens, (i + 1) * BS))));
}

/* The chain by hand: name(i) = XXH64(block i's tokens as int32 bytes,
 * seed name(i-1)), name(-1) = sess_chain_seed; 0 becomes 1. */
static uint64_t chain_by_hand(struct fx *f, const struct session *s, const int32_t *t, int i)
{
	uint64_t h = sess_chain_seed(&f->st, s);
	for (int k = 0; k <= i; k++) {
		h = XXH64(t + (size_t)k * BS, BS * sizeof(int32_t), h);
		if (h == 0)
			h = 1;
	}
	return h;
}

/* Blocks of s that carry a name, and the names are s's chain. */
static void check_named_as_chain(struct fx *f, struct session *s, int n_full)
{
	struct kvpool *p = f->pool;
	for (int i = 0; i < n_full; i++) {
		int32_t b = s->kv.blocks[i];
		uint64_t want = chain_by_hand(f, s, s->tokens, i);
		assert_true(sess_block_name(&f->st, s, i) == want);
		assert_true(p->name[b] == want);
		assert_true(p->parent[b] == (i ? chain_by_hand(f, s, s->tokens, i - 1)
					     : sess_chain_seed(&f->st, s)));
		assert_int_equal(p->owner[b], (uint32_t)s->uid);
		assert_memory_equal(p->tok + (size_t)b * BS, s->tokens + (size_t)i * BS,
				    BS * sizeof(int32_t));
	}
}

/* The prefix P (3 blocks) and tails. */
#define P_LEN (3 * BS)
#define TAIL 5

static void tokens_p_tail(int32_t *t, int32_t tail_base)
{
	run_of(t, P_LEN, 100);
	run_of(t + P_LEN, TAIL, tail_base);
}

/* ---- tests ---------------------------------------------------------- */

/* Two sessions of one owner with a common 3-block prefix and other tails:
 * the second takes the first's 3 blocks, shared, and computes only its
 * tail. */
static void test_share_basic(void **state)
{
	struct fx *f = *state;
	struct kvpool *p = f->pool;
	int32_t ta[P_LEN + TAIL], tb[P_LEN + TAIL];
	tokens_p_tail(ta, 1000);
	tokens_p_tail(tb, 2000);
	struct session *a = mk(f, UID, "a", ta, P_LEN + TAIL);
	/* nothing to find yet */
	assert_int_equal(sess_share_prefix(&f->st, a), 0);
	assert_int_equal(a->n_cached, 0);
	prefill(f, a);
	assert_int_equal(a->kv.n_blocks, 4);
	check_named_as_chain(f, a, 3);
	assert_true(p->name[a->kv.blocks[3]] == 0);  /* partial: no name */
	assert_int_equal(f->st.prefix_hit_tokens, 0);

	struct session *b = mk(f, UID, "b", tb, P_LEN + TAIL);
	int free0 = kvpool_n_free(p);
	assert_int_equal(sess_share_prefix(&f->st, b), P_LEN);
	assert_int_equal(b->n_cached, P_LEN);
	assert_int_equal(b->kv.n_blocks, 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(b->kv.blocks[i], a->kv.blocks[i]);
		assert_int_equal(p->refs[a->kv.blocks[i]], 2);
	}
	assert_int_equal(kvpool_n_free(p), free0);  /* nothing allocated */
	assert_int_equal(f->st.prefix_hit_tokens, P_LEN);
	assert_int_equal(sess_shared_blocks(&f->st, a), 3);
	check_kv(f, b);
	/* its own tail */
	prefill(f, b);
	assert_int_equal(b->kv.n_blocks, 4);
	assert_true(b->kv.blocks[3] != a->kv.blocks[3]);
	assert_int_equal(p->refs[b->kv.blocks[3]], 1);
	assert_int_equal(p->cow_copies, 0);
	check_kv(f, a);
	check_kv(f, b);
	/* fully cached: nothing more to take */
	assert_int_equal(sess_share_prefix(&f->st, b), 0);
	assert_int_equal(f->st.prefix_hit_tokens, P_LEN);

	/* P plus one token: all 3 blocks */
	int32_t t[64];
	run_of(t, P_LEN + 1, 100);
	struct session *c = mk(f, UID, "c", t, P_LEN + 1);
	assert_int_equal(sess_share_prefix(&f->st, c), P_LEN);
	/* exactly P: block 2 holds the last token, whose logits are needed */
	struct session *d = mk(f, UID, "d", t, P_LEN);
	assert_int_equal(sess_share_prefix(&f->st, d), 2 * BS);
	assert_int_equal(d->n_cached, 2 * BS);
	assert_int_equal(d->kv.n_blocks, 2);
	/* P's third block different: the first two */
	run_of(t, P_LEN + TAIL, 100);
	t[2 * BS + 3] = 7;
	struct session *e = mk(f, UID, "e", t, P_LEN + TAIL);
	assert_int_equal(sess_share_prefix(&f->st, e), 2 * BS);
	assert_int_equal(e->kv.blocks[1], a->kv.blocks[1]);
	/* the first token different: nothing, though later blocks are equal */
	run_of(t, P_LEN + TAIL, 100);
	t[0] = 99;
	struct session *g = mk(f, UID, "g", t, P_LEN + TAIL);
	assert_int_equal(sess_share_prefix(&f->st, g), 0);
	assert_int_equal(g->kv.n_blocks, 0);
	/* one block and a token; one block exactly */
	run_of(t, BS + 1, 100);
	struct session *h = mk(f, UID, "h", t, BS + 1);
	assert_int_equal(sess_share_prefix(&f->st, h), BS);
	struct session *i1 = mk(f, UID, "i", t, BS);
	assert_int_equal(sess_share_prefix(&f->st, i1), 0);
	struct session *j = mk(f, UID, "j", t, 0);
	assert_int_equal(sess_share_prefix(&f->st, j), 0);
	assert_int_equal(f->st.prefix_hit_tokens, P_LEN + P_LEN + 2 * BS + 2 * BS + BS);
	assert_int_equal(p->refs[a->kv.blocks[0]], 6);  /* a b c d e h */
	assert_int_equal(p->refs[a->kv.blocks[2]], 3);  /* a b c */
	check_kv(f, c);
	check_kv(f, d);
	check_kv(f, e);
	check_kv(f, h);
}

/* Other owner, other template, other model (base), sharing off, and a
 * session not at a block boundary: nothing is taken. */
static void test_share_refused(void **state)
{
	struct fx *f = *state;
	struct kvpool *p = f->pool;
	int32_t t[P_LEN + TAIL];
	tokens_p_tail(t, 1000);
	struct session *a = mk(f, UID, "a", t, P_LEN + TAIL);
	prefill(f, a);

	struct session *o = mk(f, UID + 1, "a", t, P_LEN + TAIL);
	assert_int_equal(sess_share_prefix(&f->st, o), 0);
	assert_int_equal(o->n_cached, 0);
	assert_int_equal(o->kv.n_blocks, 0);
	struct session *root = mk(f, 0, "root", t, P_LEN + TAIL);
	assert_int_equal(sess_share_prefix(&f->st, root), 0);

	struct session *l3 = mk(f, UID, "l3", t, P_LEN + TAIL);
	l3->tmpl = CHAT_TEMPLATE_LLAMA3;
	assert_int_equal(sess_share_prefix(&f->st, l3), 0);
	assert_int_equal(l3->kv.n_blocks, 0);

	/* another model or KV type */
	sess_set_sharing(&f->st, 1, BASE + 1);
	struct session *m = mk(f, UID, "m", t, P_LEN + TAIL);
	assert_int_equal(sess_share_prefix(&f->st, m), 0);
	/* sharing off: neither taken nor named */
	sess_set_sharing(&f->st, 0, BASE);
	assert_int_equal(sess_share_prefix(&f->st, m), 0);
	assert_int_equal(m->n_cached, 0);
	int32_t u[2 * BS + 1];
	run_of(u, 2 * BS + 1, 5000);
	struct session *off = mk(f, UID, "off", u, 2 * BS + 1);
	prefill(f, off);
	assert_true(p->name[off->kv.blocks[0]] == 0);
	assert_true(p->name[off->kv.blocks[1]] == 0);
	assert_int_equal(f->st.prefix_hit_tokens, 0);

	/* back on, the first model: m finds a's blocks after all */
	sess_set_sharing(&f->st, 1, BASE);
	assert_int_equal(sess_share_prefix(&f->st, m), P_LEN);
	assert_int_equal(m->kv.blocks[2], a->kv.blocks[2]);

	/* cached up to the middle of a block: not from there */
	struct session *mid = mk(f, UID, "mid", t, P_LEN + TAIL);
	assert_int_equal(kvseq_prepare(p, &mid->kv, 3, 0), 0);
	block_write(f, mid->kv.blocks[0], kv_key(t, BS));
	mid->n_cached = 3;
	int32_t own = mid->kv.blocks[0];
	assert_int_equal(sess_share_prefix(&f->st, mid), 0);
	assert_int_equal(mid->n_cached, 3);
	assert_int_equal(mid->kv.n_blocks, 1);
	assert_int_equal(mid->kv.blocks[0], own);
	/* cached up to a boundary (its own block 0): the rest, from block 1 */
	mid->n_cached = BS;
	assert_int_equal(sess_share_prefix(&f->st, mid), 2 * BS);
	assert_int_equal(mid->n_cached, P_LEN);
	assert_int_equal(mid->kv.blocks[0], own);
	assert_int_equal(mid->kv.blocks[1], a->kv.blocks[1]);
	assert_int_equal(mid->kv.blocks[2], a->kv.blocks[2]);
	check_kv(f, mid);
	assert_int_equal(f->st.prefix_hit_tokens, P_LEN + 2 * BS);
}

/* Blocks a session holds beyond its cache (prepared, never computed) are
 * replaced by the shared ones and go back to the pool. */
static void test_share_replaces_uncomputed(void **state)
{
	struct fx *f = *state;
	struct kvpool *p = f->pool;
	int32_t t[P_LEN + TAIL];
	tokens_p_tail(t, 1000);
	struct session *a = mk(f, UID, "a", t, P_LEN + TAIL);
	prefill(f, a);
	struct session *b = mk(f, UID, "b", t, P_LEN + TAIL);
	assert_int_equal(kvseq_prepare(p, &b->kv, b->n_tokens, 0), 0);  /* a failed step */
	assert_int_equal(b->kv.n_blocks, 4);
	int32_t own3 = b->kv.blocks[3];
	int free0 = kvpool_n_free(p);
	assert_int_equal(sess_share_prefix(&f->st, b), P_LEN);
	assert_int_equal(kvpool_n_free(p), free0 + 3);
	assert_int_equal(b->kv.n_blocks, 4);
	for (int i = 0; i < 3; i++)
		assert_int_equal(b->kv.blocks[i], a->kv.blocks[i]);
	assert_int_equal(b->kv.blocks[3], own3);
	prefill(f, b);
	check_kv(f, a);
	check_kv(f, b);
}

/* A dropped session's named blocks stay findable (counted free) until the
 * pool needs them; the blocks freed last go first: the chain's tail. */
static void test_share_from_cached(void **state)
{
	struct fx *f = *state;
	struct kvpool *p = f->pool;
	int32_t t[P_LEN + TAIL];
	tokens_p_tail(t, 1000);
	struct session *a = mk(f, UID, "a", t, P_LEN + TAIL);
	prefill(f, a);
	int32_t ab[3] = { a->kv.blocks[0], a->kv.blocks[1], a->kv.blocks[2] };
	sess_drop(&f->st, a);
	assert_int_equal(kvpool_n_free(p), NB);
	assert_int_equal(kvpool_n_cached(p), 3);

	struct session *b = mk(f, UID, "b", t, P_LEN + TAIL);
	assert_int_equal(sess_share_prefix(&f->st, b), P_LEN);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(b->kv.blocks[i], ab[i]);
		assert_int_equal(p->refs[ab[i]], 1);
	}
	assert_int_equal(kvpool_n_cached(p), 0);
	assert_int_equal(kvpool_n_free(p), NB - 3);
	check_kv(f, b);
	sess_drop(&f->st, b);
	assert_int_equal(kvpool_n_cached(p), 3);

	/* another owner fills the pool but for one block: every plain block
	 * and the two named ones freed first go */
	int32_t u[NB * BS];
	run_of(u, (NB - 1) * BS, 30000);
	struct session *x = mk(f, UID + 1, "x", u, (NB - 1) * BS);
	prefill(f, x);
	assert_int_equal(kvpool_n_free(p), 1);
	assert_int_equal(p->names_dropped, 2);
	assert_int_equal(kvpool_n_cached(p), 1);
	/* the named blocks x took hold x's K/V and no name of uid UID's */
	check_kv(f, x);
	struct session *c = mk(f, UID, "c", t, P_LEN + TAIL);
	assert_int_equal(sess_share_prefix(&f->st, c), BS);
	assert_int_equal(c->kv.blocks[0], ab[0]);
	check_kv(f, c);
}

/* Two sessions with equal tokens prefilled apart: naming the second's
 * blocks finds the first's and gives its own up. */
static void test_name_blocks_dedupe(void **state)
{
	struct fx *f = *state;
	struct kvpool *p = f->pool;
	int32_t t[P_LEN + TAIL];
	tokens_p_tail(t, 1000);
	struct session *a = mk(f, UID, "a", t, P_LEN + TAIL);
	struct session *b = mk(f, UID, "b", t, P_LEN + TAIL);
	prefill(f, a);
	assert_int_equal(kvseq_prepare(p, &b->kv, b->n_tokens, 0), 0);
	int32_t own[4];
	for (int i = 0; i < 4; i++) {
		own[i] = b->kv.blocks[i];
		block_write(f, own[i], kv_key(t, min_i(b->n_tokens, (i + 1) * BS)));
	}
	b->n_cached = b->n_tokens;
	assert_int_equal(kvpool_n_free(p), NB - 8);
	sess_name_blocks(&f->st, b);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(b->kv.blocks[i], a->kv.blocks[i]);
		assert_int_equal(p->refs[a->kv.blocks[i]], 2);
		assert_int_equal(p->refs[own[i]], 0);
		assert_true(p->name[own[i]] == 0);
	}
	assert_int_equal(b->kv.blocks[3], own[3]);  /* partial: its own */
	assert_int_equal(kvpool_n_free(p), NB - 5);
	assert_int_equal(kvpool_n_cached(p), 0);  /* given-up blocks had no name */
	check_kv(f, b);
	/* naming again changes nothing */
	sess_name_blocks(&f->st, b);
	assert_int_equal(kvpool_n_free(p), NB - 5);

	/* a block the session shares (a fork made with sharing off) is kept,
	 * and stays unnamed since an equal one has the name */
	sess_set_sharing(&f->st, 0, BASE);
	struct session *c = mk(f, UID, "c", t, P_LEN + TAIL);
	prefill(f, c);
	struct session *cf = sess_fork(&f->st, c, UID, "cf");
	assert_non_null(cf);
	sess_set_sharing(&f->st, 1, BASE);
	int32_t c0 = c->kv.blocks[0];
	sess_name_blocks(&f->st, c);
	assert_int_equal(c->kv.blocks[0], c0);
	assert_true(p->name[c0] == 0);
	assert_int_equal(p->refs[c0], 2);
	/* once c alone holds it, it is given up */
	sess_drop(&f->st, cf);
	sess_name_blocks(&f->st, c);
	assert_int_equal(c->kv.blocks[0], a->kv.blocks[0]);
	check_kv(f, c);
}

/*
 * An edit of a history cuts the chain where the tokens change: after the
 * edit and a new prefill, the session's blocks carry the names of its new
 * tokens; a session with the new tokens gets them, one with the old
 * tokens gets the old K/V (still cached) and never the new blocks.
 */
enum edit { E_REWIND, E_REPLACE, E_REMOVE_TURNS, E_REMOVE_TOKENS, E_UNCACHE };

static void edit_case(struct fx *f, enum edit how)
{
	struct kvpool *p = f->pool;
	/* turn 0: 2 blocks; turn 1: X, 17 tokens (blocks 2, 3 and a token) */
	int32_t p0[2 * BS], x[2 * BS + 1], y[2 * BS + 1], old[64], neu[64];
	run_of(p0, 2 * BS, 100);
	run_of(x, 2 * BS + 1, 1000);
	run_of(y, 2 * BS + 1, 2000);
	struct session *a = sess_create(&f->st, UID, "a");
	assert_non_null(a);
	assert_int_equal(sess_append(a, p0, 2 * BS, CHAT_USER, NULL, 1), 0);
	assert_int_equal(sess_append(a, x, 2 * BS + 1, CHAT_ASSISTANT, NULL, 1), 0);
	int n_old = a->n_tokens, n_new = 0, cut = 0;
	memcpy(old, a->tokens, (size_t)n_old * sizeof(int32_t));
	prefill(f, a);
	check_named_as_chain(f, a, 4);
	int32_t xb2 = a->kv.blocks[2], xb3 = a->kv.blocks[3];
	uint64_t xname3 = p->name[xb3];

	switch (how) {
	case E_REWIND:  /* drop X, then Y */
		assert_int_equal(sess_rewind(&f->st, a), 2 * BS + 1);
		cut = 2 * BS;
		assert_true(a->chain_n <= cut / BS);
		assert_int_equal(sess_append(a, y, 2 * BS + 1, CHAT_ASSISTANT, NULL, 1), 0);
		break;
	case E_REPLACE:  /* X becomes Y */
		assert_int_equal(sess_replace_turn(&f->st, a, 1, y, 2 * BS + 1), 0);
		cut = 2 * BS;
		break;
	case E_REMOVE_TURNS:  /* remove X, Y appended */
		assert_int_equal(sess_remove_turns(&f->st, a, 1, 1), 0);
		cut = 2 * BS;
		assert_true(a->chain_n <= cut / BS);
		assert_int_equal(sess_append(a, y, 2 * BS + 1, CHAT_ASSISTANT, NULL, 1), 0);
		break;
	case E_REMOVE_TOKENS:  /* X's first 3 tokens go: X[3..] moves down */
		assert_int_equal(sess_remove_tokens(&f->st, a, 1, 0, 3), 0);
		cut = 2 * BS;
		assert_true(a->chain_n <= cut / BS);
		assert_int_equal(sess_append(a, y, 2 * BS + 1, CHAT_USER, NULL, 1), 0);
		break;
	case E_UNCACHE:  /* a caller forgets from 2*BS+3 on and changes the tokens there */
		sess_uncache(&f->st, a, 2 * BS + 3);
		cut = 2 * BS + 3;
		assert_int_equal(a->n_cached, cut);
		assert_int_equal(a->kv.n_blocks, 3);  /* block 2 kept, partly valid */
		assert_true(a->chain_n <= cut / BS);
		for (int i = cut; i < a->n_tokens; i++)
			a->tokens[i] = 7000 + i;
		break;
	}
	assert_true(a->chain_n <= cut / BS);
	n_new = a->n_tokens;
	memcpy(neu, a->tokens, (size_t)n_new * sizeof(int32_t));
	assert_true(memcmp(old + 2 * BS, neu + 2 * BS, BS * sizeof(int32_t)) != 0);
	prefill(f, a);
	check_kv(f, a);
	int n_full = n_new / BS;
	assert_true(n_full >= 3);
	check_named_as_chain(f, a, n_full);
	/* the old blocks stayed apart, K/V and name unchanged */
	if (how != E_UNCACHE) {
		assert_true(a->kv.blocks[2] != xb2);
		assert_int_equal(p->refs[xb2], 0);
	}
	assert_true(a->kv.blocks[3] != xb3);
	assert_int_equal(p->refs[xb3], 0);
	assert_true(p->name[xb3] == xname3);
	assert_true(block_holds(f, xb3, kv_key(old, 4 * BS)));

	/* the new tokens plus one: a's blocks, all of its full ones */
	neu[n_new] = 42;
	struct session *sn = mk(f, UID, "new", neu, n_new + 1);
	assert_int_equal(sess_share_prefix(&f->st, sn), n_full * BS);
	for (int i = 0; i < n_full; i++)
		assert_int_equal(sn->kv.blocks[i], a->kv.blocks[i]);
	check_kv(f, sn);
	/* the old tokens plus one: the old K/V, none of a's new blocks */
	old[n_old] = 42;
	struct session *so = mk(f, UID, "old", old, n_old + 1);
	int got = sess_share_prefix(&f->st, so);
	assert_true(got >= 2 * BS);
	assert_int_equal(so->kv.blocks[0], a->kv.blocks[0]);
	assert_int_equal(so->kv.blocks[1], a->kv.blocks[1]);
	for (int i = 2; i < so->kv.n_blocks; i++)
		for (int k = 2; k < a->kv.n_blocks; k++)
			assert_true(so->kv.blocks[i] != a->kv.blocks[k]);
	if (how != E_UNCACHE) {
		assert_int_equal(got, 4 * BS);  /* X's blocks, still cached */
		assert_int_equal(so->kv.blocks[2], xb2);
		assert_int_equal(so->kv.blocks[3], xb3);
	}
	check_kv(f, so);
	sess_drop(&f->st, so);
	sess_drop(&f->st, sn);
	sess_drop(&f->st, a);
}

static void test_edit_rewind(void **state)
{
	edit_case(*state, E_REWIND);
}

static void test_edit_replace_turn(void **state)
{
	edit_case(*state, E_REPLACE);
}

static void test_edit_remove_turns(void **state)
{
	edit_case(*state, E_REMOVE_TURNS);
}

static void test_edit_remove_tokens(void **state)
{
	edit_case(*state, E_REMOVE_TOKENS);
}

static void test_edit_uncache(void **state)
{
	edit_case(*state, E_UNCACHE);
}

/* The chain also covers pending blocks (sess_share_prefix computes it
 * past what it finds): a pending tail replaced before it ran must not
 * keep the old tail's names. */
static void test_edit_pending(void **state)
{
	struct fx *f = *state;
	int32_t t[P_LEN + TAIL], u[P_LEN + TAIL];
	tokens_p_tail(t, 1000);
	struct session *a = mk(f, UID, "a", t, P_LEN + TAIL);
	prefill(f, a);
	/* b: one block of P, then its own two blocks and a tail */
	run_of(u, P_LEN + TAIL, 100);
	for (int i = BS; i < P_LEN; i++)
		u[i] = 5000 + i;
	struct session *b = mk(f, UID, "b", u, BS);
	assert_int_equal(sess_append(b, u + BS, P_LEN + TAIL - BS, CHAT_USER, NULL, 1), 0);
	assert_int_equal(sess_share_prefix(&f->st, b), BS);  /* chain computed past block 0 */
	assert_true(b->chain_n >= 2);
	/* turn 1 (pending) becomes P's rest: now all of a's 3 blocks match */
	assert_int_equal(sess_replace_turn(&f->st, b, 1, t + BS, P_LEN + TAIL - BS), 0);
	assert_int_equal(sess_share_prefix(&f->st, b), 2 * BS);
	for (int i = 0; i < 3; i++)
		assert_int_equal(b->kv.blocks[i], a->kv.blocks[i]);
	check_kv(f, b);
}

/* sess_uid_blocks: distinct blocks of one owner's sessions in the pool. */
static void test_uid_blocks(void **state)
{
	struct fx *f = *state;
	int32_t ta[P_LEN + TAIL], tb[P_LEN + TAIL], tc[P_LEN], td[2 * BS];
	tokens_p_tail(ta, 1000);
	tokens_p_tail(tb, 2000);
	run_of(tc, P_LEN, 3000);
	run_of(td, 2 * BS, 4000);
	assert_int_equal(sess_uid_blocks(&f->st, UID), 0);
	struct session *a = mk(f, UID, "a", ta, P_LEN + TAIL);
	prefill(f, a);
	assert_int_equal(sess_uid_blocks(&f->st, UID), 4);
	struct session *b = mk(f, UID, "b", tb, P_LEN + TAIL);
	assert_int_equal(sess_share_prefix(&f->st, b), P_LEN);
	prefill(f, b);
	assert_int_equal(sess_uid_blocks(&f->st, UID), 5);  /* 3 shared + 2 tails */
	assert_int_equal(sess_uid_blocks(&f->st, UID), 5);  /* and again */
	struct session *c = mk(f, UID + 1, "c", tc, P_LEN);
	prefill(f, c);
	assert_int_equal(sess_uid_blocks(&f->st, UID), 5);
	assert_int_equal(sess_uid_blocks(&f->st, UID + 1), 3);
	/* a session not in the pool does not count, whatever its table says */
	struct session *d = mk(f, UID, "d", td, 2 * BS);
	prefill(f, d);
	assert_int_equal(sess_uid_blocks(&f->st, UID), 7);
	d->loc = SESS_RAM;
	assert_int_equal(sess_uid_blocks(&f->st, UID), 5);
	d->loc = SESS_DISK;
	assert_int_equal(sess_uid_blocks(&f->st, UID), 5);
	d->loc = SESS_POOL;
	/* a fork holds nothing new */
	struct session *af = sess_fork(&f->st, a, UID, "af");
	assert_non_null(af);
	assert_int_equal(sess_uid_blocks(&f->st, UID), 7);
	/* a fork to another owner counts for that owner too */
	struct session *ag = sess_fork(&f->st, a, UID + 1, "ag");
	assert_non_null(ag);
	assert_int_equal(sess_uid_blocks(&f->st, UID + 1), 3 + 4);
	assert_int_equal(sess_uid_blocks(&f->st, UID), 7);
	sess_drop(&f->st, a);
	assert_int_equal(sess_uid_blocks(&f->st, UID), 7);  /* af and b hold a's */
	sess_drop(&f->st, af);
	assert_int_equal(sess_uid_blocks(&f->st, UID), 6);  /* a's tail block left */
	assert_int_equal(sess_uid_blocks(&f->st, UID + 7), 0);
}

/* A fork shares its source's blocks and names; a fork to another owner
 * does not make that owner's sessions find anything (names are per
 * owner), nor the source's owner find what the fork computed. */
static void test_fork(void **state)
{
	struct fx *f = *state;
	struct kvpool *p = f->pool;
	int32_t t[64];
	tokens_p_tail(t, 1000);
	struct session *a = mk(f, UID, "a", t, P_LEN + TAIL);
	prefill(f, a);
	struct session *fa = sess_fork(&f->st, a, UID, "fa");
	assert_non_null(fa);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(fa->kv.blocks[i], a->kv.blocks[i]);
		assert_int_equal(p->refs[a->kv.blocks[i]], 2);
	}
	for (int i = 0; i < 3; i++)
		assert_true(sess_block_name(&f->st, fa, i) == p->name[a->kv.blocks[i]]);
	/* the fork goes on: its partial block is copied, the full ones stay */
	int32_t more[BS];
	run_of(more, BS, 6000);
	assert_int_equal(sess_append(fa, more, BS, CHAT_USER, NULL, 1), 0);
	prefill(f, fa);
	assert_int_equal(p->cow_copies, 1);
	assert_true(fa->kv.blocks[3] != a->kv.blocks[3]);
	for (int i = 0; i < 3; i++)
		assert_int_equal(fa->kv.blocks[i], a->kv.blocks[i]);
	check_named_as_chain(f, fa, fa->n_tokens / BS);
	check_kv(f, a);
	check_kv(f, fa);
	/* a third session of the owner with the fork's tokens: all of them */
	int32_t ft[64];
	memcpy(ft, fa->tokens, (size_t)fa->n_tokens * sizeof(int32_t));
	ft[fa->n_tokens] = 1;
	struct session *n = mk(f, UID, "n", ft, fa->n_tokens + 1);
	assert_int_equal(sess_share_prefix(&f->st, n), fa->n_tokens / BS * BS);
	check_kv(f, n);

	/* fork to another owner: the blocks are shared ... */
	struct session *g = sess_fork(&f->st, a, UID + 1, "g");
	assert_non_null(g);
	assert_int_equal(g->kv.blocks[0], a->kv.blocks[0]);
	/* ... its chain is its owner's ... */
	assert_true(sess_chain_seed(&f->st, g) != sess_chain_seed(&f->st, a));
	for (int i = 0; i < 3; i++) {
		assert_true(sess_block_name(&f->st, g, i) == chain_by_hand(f, g, g->tokens, i));
		assert_true(sess_block_name(&f->st, g, i) != p->name[a->kv.blocks[i]]);
	}
	/* ... its blocks keep the names they had */
	sess_name_blocks(&f->st, g);
	for (int i = 0; i < 3; i++)
		assert_true(p->name[g->kv.blocks[i]] == sess_block_name(&f->st, a, i));
	/* the other owner's sessions find nothing */
	struct session *h = mk(f, UID + 1, "h", t, P_LEN + TAIL);
	assert_int_equal(sess_share_prefix(&f->st, h), 0);
	/* g goes on past a's tokens: blocks 3 and 4 are its, named for UID + 1 */
	int32_t gt[64];
	memcpy(gt, t, sizeof(int32_t) * (P_LEN + TAIL));
	run_of(gt + P_LEN + TAIL, 2 * BS - TAIL, 8000);
	assert_int_equal(sess_append(g, gt + P_LEN + TAIL, 2 * BS - TAIL, CHAT_USER, NULL, 1), 0);
	assert_int_equal(g->n_tokens, 5 * BS);
	prefill(f, g);
	check_kv(f, g);
	assert_int_equal(p->owner[g->kv.blocks[3]], UID + 1);
	assert_true(p->name[g->kv.blocks[3]] == chain_by_hand(f, g, g->tokens, 3));
	gt[5 * BS] = 3;
	struct session *h2 = mk(f, UID + 1, "h2", gt, 5 * BS + 1);
	assert_int_equal(sess_share_prefix(&f->st, h2), 0);
	/* the source's owner: its own 3 blocks, not g's block 3 */
	struct session *k = mk(f, UID, "k", gt, 5 * BS + 1);
	assert_int_equal(sess_share_prefix(&f->st, k), P_LEN);
	check_kv(f, k);
}

/* sess_block_name is the chain computed by hand; the seed separates
 * owners, templates and models. */
static void test_chain_by_hand(void **state)
{
	struct fx *f = *state;
	int32_t t[5 * BS + 3];
	for (int i = 0; i < 5 * BS + 3; i++)
		t[i] = (int32_t)((uint32_t)i * 2654435761u >> 8) - 1000000;  /* negatives too */
	struct session *s = mk(f, UID, "s", t, 5 * BS + 3);
	uint64_t seed = sess_chain_seed(&f->st, s);
	assert_true(seed == sess_chain_seed(&f->st, s));
	/* asked out of order: the chain is computed as far as needed */
	assert_true(sess_block_name(&f->st, s, 3) == chain_by_hand(f, s, t, 3));
	for (int i = 0; i < 5; i++)
		assert_true(sess_block_name(&f->st, s, i) == chain_by_hand(f, s, t, i));
	assert_true(sess_block_name(&f->st, s, 0) ==
		    XXH64(t, BS * sizeof(int32_t), seed));
	/* a block's name depends on the blocks before it */
	struct session *s2 = mk(f, UID, "s2", t, 5 * BS + 3);
	s2->tokens[0]++;
	assert_true(sess_block_name(&f->st, s2, 4) != sess_block_name(&f->st, s, 4));
	assert_true(sess_block_name(&f->st, s2, 4) == chain_by_hand(f, s2, s2->tokens, 4));
	/* the seed: owner, template, model */
	struct session *o = mk(f, UID + 1, "o", t, 5 * BS + 3);
	struct session *same = mk(f, UID, "same", t, BS);
	assert_true(sess_chain_seed(&f->st, same) == seed);
	assert_true(sess_chain_seed(&f->st, o) != seed);
	assert_true(sess_block_name(&f->st, o, 0) == chain_by_hand(f, o, t, 0));
	assert_true(sess_block_name(&f->st, o, 0) != sess_block_name(&f->st, s, 0));
	same->tmpl = CHAT_TEMPLATE_LLAMA3;
	assert_true(sess_chain_seed(&f->st, same) != seed);
	sess_set_sharing(&f->st, 1, BASE ^ 1);
	assert_true(sess_chain_seed(&f->st, s) != seed);
	/* a chain computed under an old seed is computed again */
	assert_true(sess_block_name(&f->st, s, 2) == chain_by_hand(f, s, t, 2));
	sess_set_sharing(&f->st, 1, BASE);
	assert_true(sess_block_name(&f->st, s, 2) == chain_by_hand(f, s, t, 2));
	s->tmpl = CHAT_TEMPLATE_LLAMA3;
	assert_true(sess_block_name(&f->st, s, 4) == chain_by_hand(f, s, t, 4));
	assert_true(sess_block_name(&f->st, s, 4) != sess_block_name(&f->st, s2, 4));
	s->tmpl = CHAT_TEMPLATE_LLAMA2;
	/* prefilled, the pool's names and parents are that chain */
	prefill(f, s);
	check_named_as_chain(f, s, 5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_share_basic, setup, teardown),
		cmocka_unit_test_setup_teardown(test_share_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_share_replaces_uncomputed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_share_from_cached, setup, teardown),
		cmocka_unit_test_setup_teardown(test_name_blocks_dedupe, setup, teardown),
		cmocka_unit_test_setup_teardown(test_edit_rewind, setup, teardown),
		cmocka_unit_test_setup_teardown(test_edit_replace_turn, setup, teardown),
		cmocka_unit_test_setup_teardown(test_edit_remove_turns, setup, teardown),
		cmocka_unit_test_setup_teardown(test_edit_remove_tokens, setup, teardown),
		cmocka_unit_test_setup_teardown(test_edit_uncache, setup, teardown),
		cmocka_unit_test_setup_teardown(test_edit_pending, setup, teardown),
		cmocka_unit_test_setup_teardown(test_uid_blocks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fork, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_by_hand, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
