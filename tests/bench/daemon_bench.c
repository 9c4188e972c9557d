/*
 * tests/bench/daemon_bench.c — llamad-bench-daemon: what a client sees of a
 * running daemon, over its socket.
 *
 *   llamad-bench-daemon SOCKET turn      [--history N] [--turn N] [--others K]
 *   llamad-bench-daemon SOCKET fork      [--history N]
 *   llamad-bench-daemon SOCKET aggregate [--sessions N] [--tokens N]
 *   llamad-bench-daemon SOCKET stream    [--tokens N]
 *   llamad-bench-daemon SOCKET persist-save    [--history N] [--turn N]
 *   llamad-bench-daemon SOCKET persist-restore [--history N] [--turn N]
 *   llamad-bench-daemon SOCKET churn     [--sessions N] [--rounds N] [--tokens N]
 *   llamad-bench-daemon SOCKET transcript      [--turns N]
 *   llamad-bench-daemon SOCKET transcript-disk
 *   llamad-bench-daemon SOCKET prefix    [--sessions N] [--history N] [--tokens N]
 *   llamad-bench-daemon SOCKET prefix-restore [--sessions N]
 *
 * turn:      time from sending a turn of --turn tokens (default 20) appended
 *            to a session of --history tokens (default 1500) until its first
 *            generated token arrives, against the same turn on an empty
 *            session; repeated with --others sessions of the same size held.
 * fork:      round trip of Fork on a --history token session (default 1000),
 *            with the block counts that show no KV was copied.
 * aggregate: --sessions sessions generating --tokens tokens each at once on
 *            one connection (pipelined Generate requests): total tok/s.
 * stream:    one session generating --tokens tokens: tok/s seen by the client.
 * persist-save: a --history token session "bench-persist" (default 1000):
 *            Save round trip and file bytes, and a --turn word turn (default
 *            32) on a resident fork of it. Leaves the session saved.
 * persist-restore: run after restarting the daemon on the same state
 *            directory: the same turn on the restored session (restore +
 *            turn), then the whole history + turn prefilled on an empty
 *            session (the alternative to restoring).
 * churn:     --sessions sessions (default 16), each with a different
 *            prompt, then --rounds rounds (default 3) in which every session
 *            in turn gets a short turn and --tokens tokens (default 16):
 *            aggregate tok/s of the rounds (run it with a pool that holds
 *            all of them and with one that holds a quarter).
 * transcript: a session "bench-transcript" of --turns short raw turns
 *            (default 3000), then GetTranscript of its last 10 turns
 *            (median of 21 round trips) and of all of them, page by page;
 *            saves it. transcript-disk: run after restarting the daemon on
 *            the same state directory: the last 10 turns of the session
 *            still on disk (read from its file, not restored; median of 21).
 * prefix:    prefix sharing. --sessions llama2 chat sessions (default 32)
 *            with one system prompt of --history tokens (default 1000; a
 *            support desk's rules, counted with Tokenize), each with its
 *            own ~20-token question and a greedy answer of --tokens tokens
 *            (default 16). Then the K/V they hold (distinct pool blocks,
 *            Status) against the sum of their SessionInfo.kv_bytes and
 *            against one session plus the others' own tokens (goal: below
 *            1.2x one session + those); the time to first token of one
 *            more session with that prompt against one with another prompt
 *            of the same length (best of 5, alternated; goal: <= 10%); a
 *            Save of them all. Run it on a daemon with prefix_sharing on,
 *            and off to compare (tests/bench/prefix.sh).
 * prefix-restore: run right after starting the daemon again on the state
 *            directory prefix saved into: the time until its Status
 *            answers, then each session restored from disk by a Fork
 *            (dropped again) against the same Fork once resident, then a
 *            1-token Generate on each; drops them all.
 * Output: key=value lines.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "proto/frame.h"

static int fd;
static uint64_t next_id = 1;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	fprintf(stderr, "llamad-bench-daemon: %s\n", what);
	exit(1);
}

static uint64_t send_req(Llamad__Request *q)
{
	q->has_id = 1;
	q->id = next_id++;
	if (frame_send(fd, &q->base) != 0)
		die("send failed");
	return q->id;
}

static Llamad__Response *recv_resp(void)
{
	int err = 0;
	Llamad__Response *r = frame_recv_response(fd, 1u << 26, &err);
	if (!r)
		die("connection lost");
	if (r->body_case == LLAMAD__RESPONSE__BODY_ERROR) {
		fprintf(stderr, "llamad-bench-daemon: error %s: %s\n",
			frame_error_name(r->error->code), r->error->message);
		exit(1);
	}
	return r;
}

/* Send q and return its single reply. */
static Llamad__Response *call(Llamad__Request *q)
{
	send_req(q);
	return recv_resp();
}

static void open_session(const char *name, int raw)
{
	Llamad__OpenSession o = LLAMAD__OPEN_SESSION__INIT;
	o.session = (char *)name;
	o.has_template_ = 1;
	o.template_ = raw ? LLAMAD__TEMPLATE__TEMPLATE_RAW : LLAMAD__TEMPLATE__TEMPLATE_LLAMA2;
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_OPEN;
	q.open = &o;
	llamad__response__free_unpacked(call(&q), NULL);
}

static void drop_session(const char *name)
{
	Llamad__Drop d = LLAMAD__DROP__INIT;
	d.session = (char *)name;
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_DROP;
	q.drop = &d;
	llamad__response__free_unpacked(call(&q), NULL);
}

/* Append text as a raw turn; returns the SessionInfo reply. */
static Llamad__Response *append(const char *name, const char *text)
{
	Llamad__Append a = LLAMAD__APPEND__INIT;
	a.session = (char *)name;
	a.text = (char *)text;
	a.has_role = 1;
	a.role = LLAMAD__ROLE__ROLE_RAW;
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_APPEND;
	q.append = &a;
	return call(&q);
}

static Llamad__SamplerOptions greedy = LLAMAD__SAMPLER_OPTIONS__INIT;

/* What a Generate gave: tokens, times, and its Done's counts. */
struct gen_out {
	int n;                  /* token events with tokens */
	double first_s, total_s;
	uint32_t prompt_tokens, shared_tokens, generated_tokens;
};

/* Generate on name, prompt (if any) appended as role first; fills *o. */
static void generate_as(const char *name, const char *prompt, Llamad__Role role, int max_tokens,
			struct gen_out *o)
{
	Llamad__Generate g = LLAMAD__GENERATE__INIT;
	g.session = (char *)name;
	g.prompt = (char *)prompt;
	if (prompt) {
		g.has_role = 1;
		g.role = role;
	}
	g.has_max_tokens = 1;
	g.max_tokens = (uint32_t)max_tokens;
	g.sampler = &greedy;
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_GENERATE;
	q.generate = &g;
	double t0 = now_s();
	memset(o, 0, sizeof(*o));
	send_req(&q);
	for (;;) {
		Llamad__Response *r = recv_resp();
		int end = r->body_case == LLAMAD__RESPONSE__BODY_DONE;
		if (r->body_case == LLAMAD__RESPONSE__BODY_TOKEN && r->token->n_tokens) {
			if (o->n++ == 0)
				o->first_s = now_s() - t0;
		}
		if (end) {
			o->prompt_tokens = r->done->prompt_tokens;
			o->shared_tokens = r->done->shared_tokens;
			o->generated_tokens = r->done->generated_tokens;
		}
		llamad__response__free_unpacked(r, NULL);
		if (end)
			break;
	}
	o->total_s = now_s() - t0;
}

/* Generate with a raw prompt; returns seconds until the first token event. */
static double generate(const char *name, const char *prompt, int max_tokens, int *n_tok,
		       double *total_s)
{
	struct gen_out o;
	generate_as(name, prompt, LLAMAD__ROLE__ROLE_RAW, max_tokens, &o);
	if (n_tok)
		*n_tok = o.n;
	if (total_s)
		*total_s = o.total_s;
	return o.first_s;
}

/* Text of about n tokens (Llama tokenizer: ~1.3 tokens per word here). */
static char *text_of(int n_tokens, int salt)
{
	static const char *const words[] = { "the", "river", "ran", "past", "old", "mill",
		"where", "children", "played", "every", "summer", "and", "stories", "grew" };
	size_t cap = (size_t)n_tokens * 12 + 64, len = 0;
	char *s = malloc(cap);
	if (!s)
		die("out of memory");
	unsigned x = 12345u + (unsigned)salt;
	for (int i = 0; i < n_tokens; i++) {
		x = x * 1103515245u + 12345u;
		len += (size_t)snprintf(s + len, cap - len, "%s%s", i ? " " : "",
					words[(x >> 16) % (sizeof(words) / sizeof(words[0]))]);
	}
	return s;
}

static uint32_t tokens_of(const char *name)
{
	Llamad__GetInfo gi = LLAMAD__GET_INFO__INIT;
	gi.session = (char *)name;
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_INFO;
	q.info = &gi;
	Llamad__Response *r = call(&q);
	uint32_t n = r->session->tokens;
	llamad__response__free_unpacked(r, NULL);
	return n;
}

/* A session of about `hist` tokens, fully cached. */
static void make_history(const char *name, int hist, int salt)
{
	open_session(name, 1);
	char *t = text_of(hist, salt);
	llamad__response__free_unpacked(append(name, t), NULL);
	free(t);
	/* trim/extend is not needed: report the real count */
}

static void bench_turn(int hist, int turn, int others, int reps)
{
	char *tt = text_of(turn, 999);
	double best_empty = 1e9, best_long = 1e9, best_long_others = 1e9;
	make_history("bench-long", hist, 1);
	uint32_t hist_tokens = tokens_of("bench-long");
	/* alternated, so that a change in the machine's load hits both */
	for (int r = 0; r < reps; r++) {
		char name[32];
		snprintf(name, sizeof(name), "bench-empty-%d", r);
		open_session(name, 1);
		double t = generate(name, tt, 1, NULL, NULL);
		best_empty = t < best_empty ? t : best_empty;
		drop_session(name);
		t = generate("bench-long", tt, 1, NULL, NULL);
		best_long = t < best_long ? t : best_long;
	}
	for (int k = 0; k < others; k++) {
		char name[32];
		snprintf(name, sizeof(name), "bench-other-%d", k);
		make_history(name, hist, 100 + k);
	}
	for (int r = 0; r < reps; r++) {
		double t = generate("bench-long", tt, 1, NULL, NULL);
		best_long_others = t < best_long_others ? t : best_long_others;
	}
	printf("bench=turn history_tokens=%u turn_words=%d empty_ms=%.2f long_ms=%.2f "
	       "long_with_%d_others_ms=%.2f ratio=%.2f ratio_with_others=%.2f\n",
	       hist_tokens, turn, best_empty * 1e3, best_long * 1e3, others,
	       best_long_others * 1e3, best_long / best_empty, best_long_others / best_empty);
	for (int k = 0; k < others; k++) {
		char name[32];
		snprintf(name, sizeof(name), "bench-other-%d", k);
		drop_session(name);
	}
	drop_session("bench-long");
	free(tt);
}

static void bench_fork(int hist)
{
	make_history("bench-src", hist, 7);
	double best = 1e9;
	uint32_t blocks = 0, shared = 0;
	for (int r = 0; r < 5; r++) {
		Llamad__Fork f = LLAMAD__FORK__INIT;
		f.session = (char *)"bench-src";
		f.target = (char *)"bench-dst";
		Llamad__Request q = LLAMAD__REQUEST__INIT;
		q.op_case = LLAMAD__REQUEST__OP_FORK;
		q.fork = &f;
		double t0 = now_s();
		Llamad__Response *resp = call(&q);
		double t = now_s() - t0;
		best = t < best ? t : best;
		blocks = resp->session->kv_blocks;
		shared = resp->session->shared_blocks;
		llamad__response__free_unpacked(resp, NULL);
		drop_session("bench-dst");
	}
	printf("bench=fork history_tokens=%u fork_roundtrip_ms=%.3f kv_blocks=%u shared_blocks=%u "
	       "copied_blocks=%u\n", tokens_of("bench-src"), best * 1e3, blocks, shared,
	       blocks - shared);
	drop_session("bench-src");
}

static void bench_aggregate(int n, int tokens)
{
	char names[64][32];
	if (n > 64)
		n = 64;
	for (int i = 0; i < n; i++) {
		snprintf(names[i], sizeof(names[i]), "bench-agg-%d", i);
		open_session(names[i], 1);
	}
	Llamad__Generate g[64];
	double t0 = now_s();
	for (int i = 0; i < n; i++) {
		llamad__generate__init(&g[i]);
		g[i].session = names[i];
		g[i].prompt = (char *)"Once upon a time";
		g[i].has_role = 1;
		g[i].role = LLAMAD__ROLE__ROLE_RAW;
		g[i].has_max_tokens = 1;
		g[i].max_tokens = (uint32_t)tokens;
		g[i].sampler = &greedy;
		Llamad__Request q = LLAMAD__REQUEST__INIT;
		q.op_case = LLAMAD__REQUEST__OP_GENERATE;
		q.generate = &g[i];
		send_req(&q);
	}
	int done = 0;
	long total = 0;
	while (done < n) {
		Llamad__Response *r = recv_resp();
		if (r->body_case == LLAMAD__RESPONSE__BODY_TOKEN)
			total += (long)r->token->n_tokens;
		if (r->body_case == LLAMAD__RESPONSE__BODY_DONE)
			done++;
		llamad__response__free_unpacked(r, NULL);
	}
	double t = now_s() - t0;
	printf("bench=aggregate sessions=%d tokens=%ld seconds=%.3f tok_s=%.1f\n", n, total, t,
	       total / t);
	for (int i = 0; i < n; i++)
		drop_session(names[i]);
}

static void bench_stream(int tokens)
{
	open_session("bench-stream", 1);
	int n = 0;
	double total = 0;
	double first = generate("bench-stream", "Once upon a time", tokens, &n, &total);
	printf("bench=stream tokens=%d first_token_ms=%.2f tok_s=%.1f\n", n, first * 1e3,
	       n > 1 ? (n - 1) / (total - first) : 0.0);
	drop_session("bench-stream");
}

static Llamad__Response *save(const char *name)
{
	Llamad__Save sv = LLAMAD__SAVE__INIT;
	sv.session = (char *)name;
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_SAVE;
	q.save = &sv;
	return call(&q);
}

static void bench_persist_save(int hist, int turn)
{
	make_history("bench-persist", hist, 11);
	int n;
	generate("bench-persist", NULL, 1, &n, NULL);  /* everything cached */
	double best = 1e9;
	uint64_t bytes = 0;
	for (int r = 0; r < 3; r++) {
		double t0 = now_s();
		Llamad__Response *resp = save("bench-persist");
		double t = now_s() - t0;
		best = t < best ? t : best;
		bytes = resp->saved->bytes;
		llamad__response__free_unpacked(resp, NULL);
	}
	char *tt = text_of(turn, 555);
	double resident = 1e9;
	for (int r = 0; r < 3; r++) {
		Llamad__Fork f = LLAMAD__FORK__INIT;
		f.session = (char *)"bench-persist";
		f.target = (char *)"bench-persist-fork";
		Llamad__Request q = LLAMAD__REQUEST__INIT;
		q.op_case = LLAMAD__REQUEST__OP_FORK;
		q.fork = &f;
		llamad__response__free_unpacked(call(&q), NULL);
		double t = generate("bench-persist-fork", tt, 1, NULL, NULL);
		resident = t < resident ? t : resident;
		drop_session("bench-persist-fork");
	}
	printf("bench=persist_save history_tokens=%u save_ms=%.2f file_bytes=%llu "
	       "resident_turn_ms=%.2f\n", tokens_of("bench-persist"), best * 1e3,
	       (unsigned long long)bytes, resident * 1e3);
	free(tt);
}

static void bench_persist_restore(int hist, int turn)
{
	char *tt = text_of(turn, 555);
	uint32_t before = tokens_of("bench-persist");
	double restore_turn = generate("bench-persist", tt, 1, NULL, NULL);
	/* the alternative: the whole history again, on an empty session */
	char *ht = text_of(hist, 11);
	size_t n = strlen(ht) + strlen(tt) + 2;
	char *all = malloc(n);
	if (!all)
		die("out of memory");
	snprintf(all, n, "%s %s", ht, tt);
	open_session("bench-reprefill", 1);
	double reprefill = generate("bench-reprefill", all, 1, NULL, NULL);
	printf("bench=persist_restore history_tokens=%u restore_turn_ms=%.2f reprefill_ms=%.2f "
	       "speedup_vs_reprefill=%.1f\n", before, restore_turn * 1e3, reprefill * 1e3,
	       reprefill / restore_turn);
	drop_session("bench-reprefill");
	drop_session("bench-persist");
	free(all);
	free(ht);
	free(tt);
}

static void bench_churn(int n, int rounds, int tokens)
{
	char names[256][32];
	if (n > 256)
		n = 256;
	for (int i = 0; i < n; i++) {
		snprintf(names[i], sizeof(names[i]), "bench-churn-%d", i);
		open_session(names[i], 1);
		char *t = text_of(40, 1000 + i);
		generate(names[i], t, tokens, NULL, NULL);
		free(t);
	}
	long total = 0;
	double t0 = now_s();
	for (int r = 0; r < rounds; r++)
		for (int i = 0; i < n; i++) {
			int k = 0;
			generate(names[i], " and then", tokens, &k, NULL);
			total += k;
		}
	double t = now_s() - t0;
	printf("bench=churn sessions=%d rounds=%d tokens=%ld seconds=%.3f tok_s=%.1f\n", n,
	       rounds, total, t, total / t);
	for (int i = 0; i < n; i++)
		drop_session(names[i]);
}

/* GetTranscript of name from `from` (last > 0: the last `last`): the
 * reply; its turn count in *turns, its size in *bytes. */
static Llamad__Response *transcript(const char *name, uint32_t from, uint32_t last)
{
	Llamad__GetTranscript g = LLAMAD__GET_TRANSCRIPT__INIT;
	g.session = (char *)name;
	PB_SET(&g, from_turn, from);
	if (last) {
		PB_SET(&g, last_turns, last);
	}
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_TRANSCRIPT;
	q.transcript = &g;
	return call(&q);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Median round trip (ms) of 21 GetTranscripts of name's last 10 turns. */
static double last10_ms(const char *name, uint32_t *location)
{
	double t[21];
	for (int r = 0; r < 21; r++) {
		double t0 = now_s();
		Llamad__Response *resp = transcript(name, 0, 10);
		t[r] = (now_s() - t0) * 1e3;
		if (resp->transcript->n_items != 10)
			die("GetTranscript did not give 10 turns");
		*location = resp->transcript->location;
		llamad__response__free_unpacked(resp, NULL);
	}
	qsort(t, 21, sizeof(double), cmp_double);
	return t[10];
}

static void bench_transcript(int turns)
{
	const char *name = "bench-transcript";
	open_session(name, 1);
	char text[64];
	double t0 = now_s();
	for (int i = 0; i < turns; i++) {
		snprintf(text, sizeof(text), i ? " and turn %d." : "Turn %d.", i);
		llamad__response__free_unpacked(append(name, text), NULL);
	}
	double build = now_s() - t0;
	uint32_t loc;
	double last10 = last10_ms(name, &loc);
	t0 = now_s();
	uint32_t from = 0, pages = 0, got = 0;
	size_t bytes = 0;
	for (;;) {
		Llamad__Response *resp = transcript(name, from, 0);
		bytes += llamad__response__get_packed_size(resp);
		got += (uint32_t)resp->transcript->n_items;
		pages++;
		from = resp->transcript->next;
		int more = from < resp->transcript->turns && resp->transcript->n_items > 0;
		llamad__response__free_unpacked(resp, NULL);
		if (!more)
			break;
	}
	double all = (now_s() - t0) * 1e3;
	if (got != (uint32_t)turns)
		die("the whole transcript did not come back");
	Llamad__Response *sv = save(name);
	unsigned long long file = (unsigned long long)sv->saved->bytes;
	llamad__response__free_unpacked(sv, NULL);
	printf("bench=transcript turns=%d tokens=%u build_s=%.2f last10_ms=%.3f all_ms=%.2f "
	       "all_pages=%u all_bytes=%zu state_file_bytes=%llu\n", turns, tokens_of(name), build,
	       last10, all, pages, bytes, file);
}

static void bench_transcript_disk(void)
{
	uint32_t loc = 0;
	double last10 = last10_ms("bench-transcript", &loc);
	printf("bench=transcript_disk last10_ms=%.3f location=%s\n", last10,
	       loc == LLAMAD__LOCATION__LOCATION_DISK ? "disk" : "restored");
	drop_session("bench-transcript");
}

/* ---- prefix sharing: many sessions, one long system prompt ------------- */

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static Llamad__Response *status_now(void)
{
	Llamad__GetStatus gs = LLAMAD__GET_STATUS__INIT;
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_STATUS;
	q.status = &gs;
	return call(&q);
}

static Llamad__Response *info_of(const char *name)
{
	Llamad__GetInfo gi = LLAMAD__GET_INFO__INIT;
	gi.session = (char *)name;
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_INFO;
	q.info = &gi;
	return call(&q);
}

static uint32_t count_tokens(const char *text)
{
	Llamad__Tokenize t = LLAMAD__TOKENIZE__INIT;
	t.text = (char *)text;
	PB_SET(&t, add_bos, 0);
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_TOKENIZE;
	q.tokenize = &t;
	Llamad__Response *r = call(&q);
	uint32_t n = (uint32_t)r->tokens->n_tokens;
	llamad__response__free_unpacked(r, NULL);
	return n;
}

/* The pool as Status tells it: blocks held by sessions (total - free: a
 * free block that keeps a name counts as free), of those free ones the
 * named (cached), one block's bytes and tokens, prefix sharing on. */
struct pool_use {
	uint32_t in_use, cached, block_tokens;
	uint64_t block_bytes, restores, hit_tokens;
	int sharing;
	uint32_t on_disk;
};

static void pool_use(struct pool_use *u)
{
	Llamad__Response *r = status_now();
	const Llamad__Status *st = r->status;
	u->in_use = st->kv_blocks_total - st->kv_blocks_free;
	u->cached = st->kv_blocks_cached;
	u->block_tokens = st->kv_block_tokens;
	u->block_bytes = st->kv_blocks_total ? st->kv_bytes_total / st->kv_blocks_total : 0;
	u->sharing = st->prefix_sharing;
	u->on_disk = st->sessions_on_disk;
	u->restores = st->counters ? st->counters->restores : 0;
	u->hit_tokens = st->counters ? st->counters->prefix_hit_tokens : 0;
	llamad__response__free_unpacked(r, NULL);
}

/* A llama2 chat session whose system prompt is sys. */
static void open_chat(const char *name, const char *sys)
{
	Llamad__OpenSession o = LLAMAD__OPEN_SESSION__INIT;
	o.session = (char *)name;
	o.system = (char *)sys;
	PB_SET(&o, template_, LLAMAD__TEMPLATE__TEMPLATE_LLAMA2);
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_OPEN;
	q.open = &o;
	llamad__response__free_unpacked(call(&q), NULL);
}

/* All token ids of name's history (malloc'd), their count in *n. */
static uint32_t *history_ids(const char *name, size_t *n)
{
	uint32_t *ids = NULL, from = 0;
	*n = 0;
	for (;;) {
		Llamad__GetTranscript g = LLAMAD__GET_TRANSCRIPT__INIT;
		g.session = (char *)name;
		PB_SET(&g, from_turn, from);
		PB_SET(&g, token_ids, 1);
		Llamad__Request q = LLAMAD__REQUEST__INIT;
		q.op_case = LLAMAD__REQUEST__OP_TRANSCRIPT;
		q.transcript = &g;
		Llamad__Response *r = call(&q);
		const Llamad__Transcript *t = r->transcript;
		for (size_t i = 0; i < t->n_items; i++) {
			const Llamad__Turn *it = t->items[i];
			if (it->truncated)
				die("a turn's token ids did not fit one frame");
			uint32_t *more = realloc(ids, (*n + it->n_token_ids + 1) * sizeof(*ids));
			if (!more)
				die("out of memory");
			ids = more;
			memcpy(ids + *n, it->token_ids, it->n_token_ids * sizeof(*ids));
			*n += it->n_token_ids;
		}
		from = t->next;
		int more = from < t->turns && t->n_items > 0;
		llamad__response__free_unpacked(r, NULL);
		if (!more)
			return ids;
	}
}

/* Tokens at the start of a's history that b's has too. */
static uint32_t common_tokens(const char *a, const char *b)
{
	size_t na, nb, k = 0;
	uint32_t *x = history_ids(a, &na), *y = history_ids(b, &nb);
	while (k < na && k < nb && x[k] == y[k])
		k++;
	free(x);
	free(y);
	return (uint32_t)k;
}

/* A support desk's system prompt: rules with names, goods, places, days
 * and numbers drawn from these. */
static const char *const px_names[] = { "Ada", "Bruno", "Clara", "Dmitri", "Elena", "Farid",
	"Greta", "Hiro", "Ines", "Jonas", "Kofi", "Lena" };
static const char *const px_shops[] = { "Harbour Street bookshop", "Mill Lane hardware store",
	"Riverside bakery", "Northgate bicycle workshop", "Old Town pharmacy",
	"Station Road garden centre" };
static const char *const px_items[] = { "the blue atlas of northern rivers",
	"a set of walnut bookends", "the winter edition of the cookbook", "a pair of leather gloves",
	"the large map of the coast", "a picture book about trains", "the green reading lamp",
	"a box of fountain pen ink", "the folding garden chair", "a tin of mixed biscuits" };
static const char *const px_places[] = { "Leeds", "Utrecht", "Lyon", "Porto", "Graz", "Aarhus",
	"Gdansk", "Turin", "Bergen", "Cork" };
static const char *const px_days[] = { "Monday", "Tuesday", "Wednesday", "Thursday", "Friday",
	"Saturday", "Sunday" };
static const char *const px_rules[] = {
	"When a customer asks about %I, check the stock list first and say how many are on the shelf.",
	"Orders to %P usually arrive within %N working days; say so plainly and never promise a date.",
	"If a question is about a refund, ask for the order number and the date of purchase first.",
	"Keep answers short: two or three sentences are enough unless the customer asks for more.",
	"The shop is closed on %D, and on that day you may only take messages for the staff.",
	"Never share the details of another customer, even when someone asks politely.",
	"%A from the back office handles complaints; offer to pass a message to %A when someone is unhappy.",
	"Gift wrapping costs %N euros and takes about a day; mention it when someone buys %I as a present.",
	"Speak in a friendly, calm tone, and thank the customer at the end of every conversation.",
	"If you do not know an answer, say that you will ask a colleague instead of guessing.",
	"Prices include tax, and shipping to %P is free for orders above %N0 euros.",
	"Returns are accepted within %N weeks when the item is unused and in its original box.",
	"On %D the delivery van leaves at %N o'clock, so later orders go out the next day.",
	"Customers often ask whether %I can be reserved; reservations are held for %N days.",
	"Holders of a loyalty card get %N percent off everything except gift cards.",
	"When the stock list shows none, offer to order %I from the supplier in %P.",
	"Do not give medical, legal or financial advice; point people to a professional instead.",
	"If a customer writes in another language, answer in that language when you can.",
	"Ask one question at a time, and wait for the answer before you ask the next one.",
	"%A works on %D and knows most about %I, so suggest a visit on that day.",
	"A customer from %P who waited more than %N days for a parcel gets free shipping next time.",
	"Opening hours are nine to six, and until %N o'clock in the evening on %D.",
};

static unsigned lcg(unsigned *x)
{
	*x = *x * 1103515245u + 12345u;
	return *x >> 16;
}

/* Append tmpl to s (length *len, room cap) with its %A %I %P %D %N drawn. */
static void px_fill(char *s, size_t cap, size_t *len, const char *tmpl, unsigned *x)
{
	for (const char *p = tmpl; *p && *len + 64 < cap; p++) {
		if (*p != '%' || !p[1]) {
			s[(*len)++] = *p;
			continue;
		}
		char num[8];
		const char *w = "";
		switch (*++p) {
		case 'A': w = px_names[lcg(x) % NELEM(px_names)]; break;
		case 'I': w = px_items[lcg(x) % NELEM(px_items)]; break;
		case 'P': w = px_places[lcg(x) % NELEM(px_places)]; break;
		case 'D': w = px_days[lcg(x) % NELEM(px_days)]; break;
		case 'N': snprintf(num, sizeof(num), "%u", 2 + lcg(x) % 8); w = num; break;
		}
		*len += (size_t)snprintf(s + *len, cap - *len, "%s", w);
	}
	s[*len] = '\0';
}

/* A system prompt of at least `target` tokens (the daemon's Tokenize,
 * counted in *n). Its first word names an assistant, and a shop follows,
 * chosen by salt (salts 0-71 differ), so prompts of two salts differ from
 * their first K/V block on. malloc'd. */
static char *px_system(int target, unsigned salt, uint32_t *n)
{
	size_t cap = (size_t)target * 16 + 4096;
	char *s = malloc(cap);
	if (!s)
		die("out of memory");
	unsigned x = 2024u + salt * 7919u;
	size_t len = (size_t)snprintf(s, cap, "%s is your name: you are the assistant of the %s.",
				      px_names[salt % NELEM(px_names)],
				      px_shops[salt / NELEM(px_names) % NELEM(px_shops)]);
	*n = count_tokens(s);
	while (*n < (uint32_t)target && len + 512 < cap) {
		s[len++] = ' ';
		px_fill(s, cap, &len, px_rules[lcg(&x) % NELEM(px_rules)], &x);
		*n = count_tokens(s);
	}
	return s;
}

/* Customer i's question (about 20 tokens). */
static void px_user(int i, char *buf, size_t cap)
{
	snprintf(buf, cap, "Customer %d from %s here: is %s in stock, and can it arrive by %s?", i,
		 px_places[i % NELEM(px_places)], px_items[i / 3 % NELEM(px_items)],
		 px_days[i % NELEM(px_days)]);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double least(const double *v, int n)
{
	double m = v[0];
	for (int i = 1; i < n; i++)
		m = v[i] < m ? v[i] : m;
	return m;
}

#define PX_MAX 256

/*
 * prefix: n chat sessions (llama2 template) with one system prompt of
 * about sys_tokens tokens, each with its own question and a greedy answer
 * of `answer` tokens; then the K/V they hold, the time to first token of
 * one more session with the same prompt against one with another prompt of
 * the same length (best of reps, alternated), and a Save of them all.
 */
static void bench_prefix(int n, int sys_tokens, int answer, int reps)
{
	if (n < 2 || n > PX_MAX)
		die("prefix: --sessions must be 2..256");
	static char names[PX_MAX][32];
	char user[256];
	struct pool_use u0, u;
	pool_use(&u0);
	const char *mode = u0.sharing ? "on" : "off";
	uint32_t sys_n;
	char *sys = px_system(sys_tokens, 0, &sys_n);

	/* the n sessions */
	struct gen_out o, first = { 0 };
	uint32_t sh_min = UINT32_MAX, sh_max = 0, turn_min = UINT32_MAX, turn_max = 0;
	uint32_t gen_min = UINT32_MAX, gen_max = 0;
	double t0 = now_s(), later_ttft[PX_MAX];
	for (int i = 0; i < n; i++) {
		snprintf(names[i], sizeof(names[i]), "bench-prefix-%d", i);
		open_chat(names[i], sys);
		px_user(i, user, sizeof(user));
		uint32_t ut = count_tokens(user);
		turn_min = ut < turn_min ? ut : turn_min;
		turn_max = ut > turn_max ? ut : turn_max;
		generate_as(names[i], user, LLAMAD__ROLE__ROLE_USER, answer, &o);
		gen_min = o.generated_tokens < gen_min ? o.generated_tokens : gen_min;
		gen_max = o.generated_tokens > gen_max ? o.generated_tokens : gen_max;
		if (i == 0) {
			first = o;
			continue;
		}
		later_ttft[i - 1] = o.first_s;
		sh_min = o.shared_tokens < sh_min ? o.shared_tokens : sh_min;
		sh_max = o.shared_tokens > sh_max ? o.shared_tokens : sh_max;
	}
	double build_s = now_s() - t0;
	printf("bench=prefix sharing=%s sessions=%d system_tokens=%u turn_tokens=%u-%u "
	       "answer_tokens=%u-%u first_prompt_tokens=%u first_ttft_ms=%.1f "
	       "later_shared_tokens=%u-%u later_ttft_median_ms=%.1f build_s=%.2f\n",
	       mode, n, sys_n, turn_min, turn_max, gen_min, gen_max,
	       first.prompt_tokens + first.shared_tokens, first.first_s * 1e3, sh_min, sh_max,
	       median(later_ttft, n - 1) * 1e3, build_s);

	/* K/V held: distinct pool blocks, against the sum of the sessions'
	 * own counts and against one session plus the others' own tokens */
	pool_use(&u);
	uint32_t common = common_tokens(names[0], names[1]);
	uint64_t sum = 0, one = 0, own_tokens = 0;
	uint32_t blocks_one = 0, shared_one = 0, shared_most = 0, own_blocks = 0;
	for (int i = 0; i < n; i++) {
		Llamad__Response *r = info_of(names[i]);
		sum += r->session->kv_bytes;
		/* what the pool must hold: the shared blocks once, and the
		 * blocks each session alone holds */
		own_blocks += r->session->kv_blocks - r->session->shared_blocks;
		if (r->session->shared_blocks > shared_most)
			shared_most = r->session->shared_blocks;
		if (i == 0) {
			one = r->session->kv_bytes;
			blocks_one = r->session->kv_blocks;
			shared_one = r->session->shared_blocks;
		} else {
			own_tokens += r->session->tokens - common;
		}
		llamad__response__free_unpacked(r, NULL);
	}
	uint64_t held = (uint64_t)(u.in_use - u0.in_use) * u.block_bytes;
	double own_bytes = (double)own_tokens * (double)u.block_bytes / u.block_tokens;
	double goal = 1.2 * (double)one + own_bytes;
	printf("bench=prefix_kv sharing=%s blocks_in_use=%u blocks_cached=%u block_bytes=%llu "
	       "held_bytes=%llu sum_session_kv_bytes=%llu one_session_kv_bytes=%llu "
	       "one_session_blocks=%u one_session_shared_blocks=%u needed_blocks=%u common_tokens=%u "
	       "others_own_tokens=%llu others_own_bytes=%.0f held_vs_one=%.2f "
	       "held_vs_one_plus_own=%.3f held_vs_sum=%.3f goal_bytes=%.0f goal=%s\n",
	       mode, u.in_use - u0.in_use, u.cached, (unsigned long long)u.block_bytes,
	       (unsigned long long)held, (unsigned long long)sum, (unsigned long long)one,
	       blocks_one, shared_one, shared_most + own_blocks, common,
	       (unsigned long long)own_tokens, own_bytes,
	       (double)held / (double)one, (double)held / ((double)one + own_bytes),
	       (double)held / (double)sum, goal, (double)held < goal ? "met" : "missed");

	/* time to first token: the same prompt (warm when shared) against
	 * another of the same length, alternated */
	double same[16], other[16];
	uint32_t same_shared = 0, other_shared = 0, other_n = 0, same_prompt = 0, other_prompt = 0;
	if (reps > 16)
		reps = 16;
	for (int r = 0; r < reps; r++) {
		px_user(n + r, user, sizeof(user));
		open_chat("bench-prefix-same", sys);
		generate_as("bench-prefix-same", user, LLAMAD__ROLE__ROLE_USER, 1, &o);
		same[r] = o.first_s;
		same_shared = o.shared_tokens;
		same_prompt = o.prompt_tokens;
		drop_session("bench-prefix-same");
		char *other_sys = px_system(sys_tokens, 1 + (unsigned)r, &other_n);
		open_chat("bench-prefix-other", other_sys);
		generate_as("bench-prefix-other", user, LLAMAD__ROLE__ROLE_USER, 1, &o);
		other[r] = o.first_s;
		other_shared = o.shared_tokens > other_shared ? o.shared_tokens : other_shared;
		other_prompt = o.prompt_tokens;
		drop_session("bench-prefix-other");
		free(other_sys);
	}
	double same_best = least(same, reps), other_best = least(other, reps);
	double ratio = same_best / other_best;
	printf("bench=prefix_ttft sharing=%s same_prompt_ms=%.1f same_prompt_median_ms=%.1f "
	       "same_prefilled=%u same_shared=%u other_prompt_ms=%.1f other_prompt_median_ms=%.1f "
	       "other_prefilled=%u other_shared=%u other_system_tokens=%u ratio=%.3f "
	       "goal=%s reps=%d\n",
	       mode, same_best * 1e3, median(same, reps) * 1e3, same_prompt, same_shared,
	       other_best * 1e3, median(other, reps) * 1e3, other_prompt, other_shared, other_n,
	       ratio, ratio <= 0.10 ? "met" : "missed", reps);

	/* save them all */
	Llamad__Save sv = LLAMAD__SAVE__INIT;
	PB_SET(&sv, all, 1);
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_SAVE;
	q.save = &sv;
	t0 = now_s();
	Llamad__Response *r = call(&q);
	double save_s = now_s() - t0;
	printf("bench=prefix_save sharing=%s save_ms=%.1f saved_sessions=%u saved_bytes=%llu\n",
	       mode, save_s * 1e3, r->saved->sessions, (unsigned long long)r->saved->bytes);
	llamad__response__free_unpacked(r, NULL);
	free(sys);
}

/* Round trip of a Fork of name (which brings it into the pool first), the
 * fork then dropped. */
static double fork_probe(const char *name)
{
	Llamad__Fork f = LLAMAD__FORK__INIT;
	f.session = (char *)name;
	f.target = (char *)"bench-prefix-probe";
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_FORK;
	q.fork = &f;
	double t0 = now_s();
	llamad__response__free_unpacked(call(&q), NULL);
	double t = now_s() - t0;
	drop_session("bench-prefix-probe");
	return t;
}

/*
 * prefix-restore: after a restart on the state directory bench_prefix
 * saved into. The time from this program's start (the daemon was started
 * just before it) until a Status answers; then each of the n sessions
 * restored from disk by a Fork (which needs its source in the pool; the
 * fork is dropped), against the same Forks once all are resident; then a
 * 1-token Generate on each (Done's prompt tokens show that the K/V came
 * back: 1, not the whole history); drops them all.
 */
static void bench_prefix_restore(int n, double t_start)
{
	if (n < 1 || n > PX_MAX)
		die("prefix-restore: --sessions must be 1..256");
	struct pool_use u0, u;
	pool_use(&u0);
	double up_s = now_s() - t_start;
	const char *mode = u0.sharing ? "on" : "off";
	char name[32];
	double t[PX_MAX], res[PX_MAX], gen[PX_MAX], total = 0;
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "bench-prefix-%d", i);
		t[i] = fork_probe(name);
		total += t[i];
	}
	pool_use(&u);
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "bench-prefix-%d", i);
		res[i] = fork_probe(name);
	}
	uint32_t prefilled_max = 0;
	for (int i = 0; i < n; i++) {
		struct gen_out o;
		snprintf(name, sizeof(name), "bench-prefix-%d", i);
		generate_as(name, NULL, LLAMAD__ROLE__ROLE_USER, 1, &o);
		gen[i] = o.total_s;
		prefilled_max = o.prompt_tokens > prefilled_max ? o.prompt_tokens : prefilled_max;
	}
	double first = t[0];
	printf("bench=prefix_restore sharing=%s restart_ms=%.1f sessions_on_disk=%u "
	       "restore_total_ms=%.1f restore_per_session_ms=%.2f first_ms=%.1f "
	       "later_median_ms=%.2f resident_fork_median_ms=%.3f restores=%llu "
	       "blocks_in_use=%u then_1_token_median_ms=%.1f then_prefilled_max=%u\n",
	       mode, up_s * 1e3, u0.on_disk, total * 1e3, total * 1e3 / n, first * 1e3,
	       n > 1 ? median(t + 1, n - 1) * 1e3 : first * 1e3, median(res, n) * 1e3,
	       (unsigned long long)(u.restores - u0.restores), u.in_use, median(gen, n) * 1e3,
	       prefilled_max);
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "bench-prefix-%d", i);
		drop_session(name);
	}
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: llamad-bench-daemon SOCKET turn|fork|aggregate|stream|"
			"persist-save|persist-restore|churn|transcript|transcript-disk|prefix|"
			"prefix-restore [--history N] [--turn N] [--others K] [--sessions N] "
			"[--tokens N] [--rounds N] [--turns N]\n");
		return 2;
	}
	int hist = -1, turn = -1, others = 8, sessions = -1, tokens = -1, rounds = 3, turns = 3000;
	for (int i = 3; i + 1 < argc; i += 2) {
		int v = atoi(argv[i + 1]);
		if (!strcmp(argv[i], "--history"))
			hist = v;
		else if (!strcmp(argv[i], "--turn"))
			turn = v;
		else if (!strcmp(argv[i], "--others"))
			others = v;
		else if (!strcmp(argv[i], "--sessions"))
			sessions = v;
		else if (!strcmp(argv[i], "--tokens"))
			tokens = v;
		else if (!strcmp(argv[i], "--rounds"))
			rounds = v;
		else if (!strcmp(argv[i], "--turns"))
			turns = v;
		else {
			fprintf(stderr, "llamad-bench-daemon: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	double t_start = now_s();
	fd = frame_dial(argv[1]);
	/* prefix-restore times the daemon's start: wait for it (2 min) */
	for (int k = 0; fd < 0 && !strcmp(argv[2], "prefix-restore") && k < 12000; k++) {
		usleep(10000);
		fd = frame_dial(argv[1]);
	}
	if (fd < 0) {
		fprintf(stderr, "llamad-bench-daemon: cannot connect to %s: %s\n", argv[1],
			strerror(-fd));
		return 3;
	}
	greedy.has_temperature = 1;
	greedy.temperature = 0;
	if (!strcmp(argv[2], "turn"))
		bench_turn(hist < 0 ? 1500 : hist, turn < 0 ? 20 : turn, others, 5);
	else if (!strcmp(argv[2], "persist-save"))
		bench_persist_save(hist < 0 ? 1000 : hist, turn < 0 ? 32 : turn);
	else if (!strcmp(argv[2], "persist-restore"))
		bench_persist_restore(hist < 0 ? 1000 : hist, turn < 0 ? 32 : turn);
	else if (!strcmp(argv[2], "churn"))
		bench_churn(sessions < 0 ? 16 : sessions, rounds, tokens < 0 ? 16 : tokens);
	else if (!strcmp(argv[2], "fork"))
		bench_fork(hist < 0 ? 1000 : hist);
	else if (!strcmp(argv[2], "aggregate"))
		bench_aggregate(sessions < 0 ? 4 : sessions, tokens < 0 ? 128 : tokens);
	else if (!strcmp(argv[2], "stream"))
		bench_stream(tokens < 0 ? 128 : tokens);
	else if (!strcmp(argv[2], "prefix"))
		bench_prefix(sessions < 0 ? 32 : sessions, hist < 0 ? 1000 : hist,
			     tokens < 0 ? 16 : tokens, 5);
	else if (!strcmp(argv[2], "prefix-restore"))
		bench_prefix_restore(sessions < 0 ? 32 : sessions, t_start);
	else if (!strcmp(argv[2], "transcript"))
		bench_transcript(turns);
	else if (!strcmp(argv[2], "transcript-disk"))
		bench_transcript_disk();
	else {
		fprintf(stderr, "llamad-bench-daemon: unknown benchmark %s\n", argv[2]);
		return 2;
	}
	close(fd);
	return 0;
}
