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

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: llamad-bench-daemon SOCKET turn|fork|aggregate|stream "
			"[--history N] [--turn N] [--others K] [--sessions N] [--tokens N]\n");
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
	fd = frame_dial(argv[1]);
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
