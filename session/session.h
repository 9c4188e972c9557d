/*
 * session/session.h — the session table: one conversation per (owner uid,
 * id), each with its token history, its turns and its block table in the
 * shared KV pool.
 *
 * A session's history is tokens[0, n_tokens); the first n_cached of them
 * have K/V in the cache, the rest are pending (they go through the model the
 * next time the session runs). The session module knows nothing of sockets,
 * tokenizers or the model: callers hand it token ids.
 */
#ifndef LLAMAD_SESSION_SESSION_H
#define LLAMAD_SESSION_SESSION_H

#include <stdint.h>
#include <sys/types.h>

#include "session/kvpool.h"
#include "text/chat.h"
#include "util/session_id.h"

/* Roles and templates are text/chat.h's enum chat_role / chat_template
 * (the session stores and checks them, never interprets them). Values
 * match proto/llamad.proto (ContextPolicy). */
enum sess_policy { SESS_CTX_ERROR = 1, SESS_CTX_SHIFT = 2 };
/* Where a session's K/V is (values match proto Location). */
enum sess_loc { SESS_POOL = 0, SESS_RAM = 1, SESS_DISK = 2 };

/* Highest sess_turn.end (the wire's STOP_CANCELLED). */
#define SESS_END_MAX 5

struct sess_turn {
	int start;            /* index of its first token */
	uint8_t role;         /* enum chat_role */
	uint8_t end;          /* an answer the model generated: why it ended (the
			       * wire's StopReason, 1..5); 0: not ended, or not
			       * generated */
	char *text;           /* the client's text (NULL for generated answers) */
	int slid;             /* an answer that outgrew the context (policy shift):
			       * its first tokens that slid out, gone from the
			       * history (not in the state file) */
};

struct session {
	char id[SESSION_ID_MAX + 1];
	uid_t uid;
	int32_t *tokens;
	int n_tokens, cap;
	int n_cached;
	struct kvseq kv;
	struct sess_turn *turns;
	int n_turns, turns_cap;
	char *system;         /* system prompt of the first user turn (llama2) */
	char *next_system;    /* set by a system turn: used by the next user turn */
	int tmpl;             /* enum chat_template */
	int policy;           /* enum sess_policy */
	int64_t last_use_ms;
	uint64_t prefilled;   /* tokens run through the model, ever */
	uint64_t generated;
	/* context shifts (turns.c), ever, for transcripts: turns dropped whole
	 * and the tokens removed (theirs and answers' slid ones); kept while
	 * the daemon runs, not in the state file */
	uint32_t shift_turns;
	uint64_t shift_tokens;
	int busy;             /* a job (append or generate) runs on it */
	int ephemeral;
	uint64_t owner_conn;  /* connection that opened an ephemeral session */
	/* persistence and eviction */
	int loc;              /* enum sess_loc */
	int dirty;            /* changed since its state file was written */
	int foreign;          /* its state file was written under another model */
	uint64_t file_bytes;  /* size of its state file (0: none) */
	void *ram_kv;         /* SESS_RAM: its blocks, kv_block_bytes each (owned
			       * by session/residency.c, which frees it) */
	size_t ram_bytes;
	int ram_blocks;
	uint32_t disk_tokens; /* SESS_DISK: history length from the file header */
	uint32_t disk_turns;  /* SESS_DISK: its turns, from the file header */
	/* failed saves (residency.c): automatic ones wait save_wait_s, which
	 * doubles, until save_retry_s (monotonic); all 0 once one works */
	uint32_t save_fails;  /* saves failed since the last that worked */
	double save_wait_s, save_retry_s;
	int file_refused;     /* SESS_DISK: its state file was refused when read
			       * (corrupt, unknown format): a drop moves it
			       * aside (store_set_aside), never deletes it */
	unsigned evict_scan;  /* eviction pass that found it unmovable */
	/* prefix sharing: the names of the first chain_n full blocks of its
	 * tokens (cached or not), under chain_seed (owner, template, model) */
	uint64_t *chain;
	int chain_n, chain_cap;
	uint64_t chain_seed;
	/* its K/V came from a state file of another element type (converted,
	 * so not what this daemon computes): it neither takes nor gives
	 * shared blocks, and is saved without block files, until its cache
	 * is computed again from position 0 */
	int inexact;
	/* the shared blocks its state file refers to (residency.c) */
	uint64_t *file_refs;
	int n_file_refs;
	struct session *hnext;
};

struct sess_table {
	struct session **buckets;
	int n_buckets;
	int count;
	struct kvpool *pool;
	/* prefix sharing (sess_share_prefix, sess_name_blocks): on or off, what
	 * every chain's seed starts from (model fingerprint, KV type), and
	 * the cached tokens sessions took from other sessions' blocks */
	int share;
	uint64_t name_base;
	uint64_t prefix_hit_tokens;
};

/* 1 if id is 1..128 chars of [A-Za-z0-9._:-]. */
int sess_id_valid(const char *id);

/* Table over pool (not owned). 0 or -ENOMEM. */
int sess_table_init(struct sess_table *t, struct kvpool *pool);
/* Free every session and the table. */
void sess_table_done(struct sess_table *t);

/* The session `id` visible to uid: its own; for root (uid 0) also another
 * uid's if no root session has that id. NULL if none. */
struct session *sess_find(struct sess_table *t, uid_t uid, const char *id);
/* New empty session; NULL on ENOMEM. The id must be valid and free for uid. */
struct session *sess_create(struct sess_table *t, uid_t uid, const char *id);
/* The session (uid, id) exactly, no root fallback. NULL if none. */
struct session *sess_get(struct sess_table *t, uid_t uid, const char *id);
/* Remove and free a session, releasing its blocks (one in host memory goes
 * through res_drop, which frees that memory). */
void sess_drop(struct sess_table *t, struct session *s);
/* New session dst_id for uid sharing all of src's history and KV blocks
 * (no KV copied). NULL on ENOMEM. */
struct session *sess_fork(struct sess_table *t, struct session *src, uid_t uid,
			  const char *dst_id);

/* Append n token ids as a new turn of `role` (text: the client's text, may
 * be NULL; copied). With new_turn == 0 the ids extend the last turn.
 * 0 or -ENOMEM (nothing changed). */
int sess_append(struct session *s, const int32_t *ids, int n, int role,
		const char *text, int new_turn);
/* Remove the last turn (tokens and cache beyond it). Returns the number of
 * tokens removed, or -ENOENT if there is no turn. */
int sess_rewind(struct sess_table *t, struct session *s);
/* Release s's blocks, token history, turns and system prompts (the
 * session stays in the table, empty). */
void sess_clear_history(struct sess_table *t, struct session *s);

/* Forget cached K/V from position n on (history kept; it becomes pending). */
void sess_uncache(struct sess_table *t, struct session *s, int n);
/* Remove turns [first, first+count) and their tokens; later turns move
 * down. The cache from the first removed token on is forgotten (positions
 * change). 0, or -EINVAL for a bad range. */
int sess_remove_turns(struct sess_table *t, struct session *s, int first, int count);
/* Remove count tokens of turn idx from its from-th on (the turn and the
 * later ones stay, shorter and moved down). The cache from the first
 * removed token on is forgotten. 0, or -EINVAL for a range outside the
 * turn. */
int sess_remove_tokens(struct sess_table *t, struct session *s, int idx, int from, int count);
/* Replace the tokens of turn idx with ids (n); later turns move. The cache
 * from that turn on is forgotten. 0, -EINVAL or -ENOMEM (nothing changed). */
int sess_replace_turn(struct sess_table *t, struct session *s, int idx,
		      const int32_t *ids, int n);

/*
 * Prefix sharing. A full block of a session's tokens is named by a chain:
 * name(i) = XXH64(its tokens, seed = name(i-1)), name(-1) the session's
 * seed (t->name_base, owner uid, template). Positions are implicit: block i
 * holds positions [i*bs, (i+1)*bs).
 *
 * Turn sharing on (1) or off (0) for what comes next; base identifies the
 * model and the KV type (blocks of another never match).
 */
void sess_set_sharing(struct sess_table *t, int on, uint64_t base);
/* Before s is prefilled: while its next pending block is whole, is not the
 * one holding its last token (whose logits a generation needs), and the
 * pool holds a block of that name made by the same owner from the same
 * tokens, take it (shared, copy-on-write) and count it cached. Only from
 * a block boundary. Returns the tokens so taken (0 when sharing is off). */
int sess_share_prefix(struct sess_table *t, struct session *s);
/* After s's cache grew: name its full cached blocks that have no name yet;
 * a block whose name another block already has is given up for that one
 * (when s alone held it). */
void sess_name_blocks(struct sess_table *t, struct session *s);
/* The name of s's block i (i < n_tokens / block_size), computing the chain
 * as far as needed; 0 on ENOMEM. */
uint64_t sess_block_name(struct sess_table *t, struct session *s, int i);
/* The chain's seed for s (what block 0's name is made from). */
uint64_t sess_chain_seed(const struct sess_table *t, const struct session *s);
/* Distinct pool blocks held by uid's sessions in the pool (a block several
 * of them share counts once). */
int sess_uid_blocks(struct sess_table *t, uid_t uid);

/* Blocks of s that other sessions share. */
int sess_shared_blocks(const struct sess_table *t, const struct session *s);
/* A session's length in tokens, whether its cache is loaded or on disk. */
uint32_t sess_length(const struct session *s);

/* Visit every session visible to uid (all for root). fn may drop the
 * session it is given (and no other). */
void sess_foreach(struct sess_table *t, uid_t uid,
		  void (*fn)(struct session *s, void *ctx), void *ctx);
/* The same over uid's own sessions only (root's too: no others). */
void sess_foreach_owned(struct sess_table *t, uid_t uid,
			void (*fn)(struct session *s, void *ctx), void *ctx);

#endif
