/*
 * gateway/metrics.c — GET /metrics: each model's llamad Status and the
 * gateway's own counters in Prometheus' text format (version 0.0.4).
 * The models are asked one after the other on fresh connections acting
 * for the caller, so a caller other than root and llamad's own user gets
 * llamad's figures of its own work (Status.own: what counts others' work
 * is not sent, and its metric is left out); the gateway's own counters,
 * which count every caller's requests, go to root and the gateway's own
 * user only. A model that does not answer is reported as llamad_up 0.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "gateway/http_int.h"

enum { M_COUNTER, M_GAUGE };

/* One number of Status (or of its Counters). */
struct metric {
	const char *name, *help;
	int type;
	double (*get)(const Llamad__Status *s);
};

/* A field not sent is NAN: its metric is not written. */
#define SF(field) static double s_##field(const Llamad__Status *s) \
	{ return s->has_##field ? (double)s->field : NAN; }
#define CF(field) static double c_##field(const Llamad__Status *s) \
	{ return s->counters && s->counters->has_##field ? (double)s->counters->field : NAN; }
SF(uptime_s) SF(sessions) SF(active) SF(connections) SF(kv_blocks_total) SF(kv_blocks_free)
SF(kv_blocks_cached) SF(kv_bytes_total) SF(weight_bytes) SF(rss_bytes) SF(ram_bytes_used)
SF(ram_bytes_total) SF(sessions_in_ram) SF(sessions_on_disk) SF(block_files) SF(block_file_bytes)
CF(requests) CF(errors) CF(connections) CF(prefilled_tokens) CF(generated_tokens) CF(forward_passes)
CF(cow_copies) CF(evictions_ram) CF(evictions_disk) CF(restores) CF(saves) CF(save_errors)
CF(files_set_aside) CF(prefix_hit_tokens)

static const struct metric metrics[] = {
	{ "llamad_uptime_seconds", "Seconds since llamad started.", M_GAUGE, s_uptime_s },
	{ "llamad_sessions", "Sessions held.", M_GAUGE, s_sessions },
	{ "llamad_sessions_active", "Sessions generating or prefilling.", M_GAUGE, s_active },
	{ "llamad_connections", "Client connections open.", M_GAUGE, s_connections },
	{ "llamad_sessions_in_ram", "Sessions whose K/V was moved to host memory.", M_GAUGE, s_sessions_in_ram },
	{ "llamad_sessions_on_disk", "Sessions held only in the state directory.", M_GAUGE, s_sessions_on_disk },
	{ "llamad_kv_blocks", "Blocks of the KV pool.", M_GAUGE, s_kv_blocks_total },
	{ "llamad_kv_blocks_free", "Free blocks of the KV pool.", M_GAUGE, s_kv_blocks_free },
	{ "llamad_kv_blocks_cached", "Free blocks still holding a shared prefix.", M_GAUGE, s_kv_blocks_cached },
	{ "llamad_kv_bytes", "Bytes of the KV pool.", M_GAUGE, s_kv_bytes_total },
	{ "llamad_weight_bytes", "Bytes of the model's weights.", M_GAUGE, s_weight_bytes },
	{ "llamad_rss_bytes", "Resident memory of llamad.", M_GAUGE, s_rss_bytes },
	{ "llamad_ram_cache_bytes", "Evicted K/V held in host memory.", M_GAUGE, s_ram_bytes_used },
	{ "llamad_ram_cache_limit_bytes", "Limit of the host-memory K/V cache.", M_GAUGE, s_ram_bytes_total },
	{ "llamad_block_files", "Shared block files in the state directory.", M_GAUGE, s_block_files },
	{ "llamad_block_file_bytes", "Bytes of the shared block files.", M_GAUGE, s_block_file_bytes },
	{ "llamad_requests_total", "Requests llamad served.", M_COUNTER, c_requests },
	{ "llamad_errors_total", "Requests that ended in an error.", M_COUNTER, c_errors },
	{ "llamad_connections_total", "Connections accepted.", M_COUNTER, c_connections },
	{ "llamad_prefilled_tokens_total", "Tokens run through the model as prompt.", M_COUNTER, c_prefilled_tokens },
	{ "llamad_generated_tokens_total", "Tokens generated.", M_COUNTER, c_generated_tokens },
	{ "llamad_forward_passes_total", "Forward passes.", M_COUNTER, c_forward_passes },
	{ "llamad_cow_copies_total", "Copy-on-write block copies.", M_COUNTER, c_cow_copies },
	{ "llamad_evictions_ram_total", "Sessions moved from the pool to host memory.", M_COUNTER, c_evictions_ram },
	{ "llamad_evictions_disk_total", "Sessions moved to the state directory.", M_COUNTER, c_evictions_disk },
	{ "llamad_restores_total", "Sessions brought back into the pool.", M_COUNTER, c_restores },
	{ "llamad_saves_total", "State files written.", M_COUNTER, c_saves },
	{ "llamad_save_errors_total", "Failed saves.", M_COUNTER, c_save_errors },
	{ "llamad_files_set_aside_total", "Refused state files renamed aside.", M_COUNTER, c_files_set_aside },
	{ "llamad_prefix_hit_tokens_total", "Prompt tokens taken from shared blocks.", M_COUNTER, c_prefix_hit_tokens },
};
#define N_METRICS (sizeof(metrics) / sizeof(metrics[0]))
#define N_HIST 2

struct hist {
	size_t n;                  /* bounds */
	double le[32];
	uint64_t counts[33];
	double sum;
	uint64_t count;
};

struct mstate {
	struct gw *g;
	struct evhttp_request *req;
	struct caller who;
	struct up *up;
	size_t at;                 /* model asked now */
	bool *up_ok;
	double (*vals)[N_METRICS];
	struct hist (*hists)[N_HIST];
};

static void ask_next(struct mstate *s);

static void copy_hist(struct hist *h, const Llamad__Histogram *p)
{
	memset(h, 0, sizeof(*h));
	if (!p || p->n_counts != p->n_le + 1 || p->n_le > 32)
		return;
	h->n = p->n_le;
	memcpy(h->le, p->le, p->n_le * sizeof(double));
	memcpy(h->counts, p->counts, p->n_counts * sizeof(uint64_t));
	h->sum = p->sum;
	h->count = p->count;
}

static void on_status(void *arg, const Llamad__Response *r, int err)
{
	(void)err;
	struct mstate *s = arg;
	if (r && r->body_case == LLAMAD__RESPONSE__BODY_HELLO) {
		Llamad__GetStatus gs = LLAMAD__GET_STATUS__INIT;
		Llamad__Request rq = LLAMAD__REQUEST__INIT;
		rq.op_case = LLAMAD__REQUEST__OP_STATUS;
		rq.status = &gs;
		if (up_call(s->up, &rq, on_status, s) == 0)
			return;
	} else if (r && r->body_case == LLAMAD__RESPONSE__BODY_STATUS && r->status) {
		s->up_ok[s->at] = true;
		for (size_t i = 0; i < N_METRICS; i++)
			s->vals[s->at][i] = metrics[i].get(r->status);
		copy_hist(&s->hists[s->at][0], r->status->ttft);
		copy_hist(&s->hists[s->at][1], r->status->token_time);
	}
	up_close(s->up);
	s->up = NULL;
	s->at++;
	ask_next(s);
}

static void put_label(struct evbuffer *b, const char *name)
{
	evbuffer_add_printf(b, "{model=\"");
	for (const char *p = name; *p; p++) {
		if (*p == '"' || *p == '\\')
			evbuffer_add(b, "\\", 1);
		evbuffer_add(b, p, 1);
	}
	evbuffer_add_printf(b, "\"");
}

static void put_hist(struct evbuffer *b, struct mstate *s, int k, const char *name, const char *help)
{
	evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	for (size_t m = 0; m < s->g->n_models; m++) {
		const struct hist *h = &s->hists[m][k];
		if (!s->up_ok[m] || !h->n)
			continue;
		uint64_t cum = 0;
		for (size_t i = 0; i <= h->n; i++) {
			cum += h->counts[i];
			evbuffer_add_printf(b, "%s_bucket", name);
			put_label(b, s->g->models[m].name);
			evbuffer_add_printf(b, ",le=\"");
			if (i < h->n)
				evbuffer_add_printf(b, "%g", h->le[i]);
			else
				evbuffer_add_printf(b, "+Inf");
			evbuffer_add_printf(b, "\"} %llu\n", (unsigned long long)cum);
		}
		evbuffer_add_printf(b, "%s_sum", name);
		put_label(b, s->g->models[m].name);
		evbuffer_add_printf(b, "} %.9g\n%s_count", h->sum, name);
		put_label(b, s->g->models[m].name);
		evbuffer_add_printf(b, "} %llu\n", (unsigned long long)h->count);
	}
}

static void finish(struct mstate *s)
{
	struct gw *g = s->g;
	struct evbuffer *b = evbuffer_new();
	evbuffer_add_printf(b, "# HELP llamad_up Whether the model's llamad answered.\n# TYPE llamad_up gauge\n");
	for (size_t m = 0; m < g->n_models; m++) {
		evbuffer_add_printf(b, "llamad_up");
		put_label(b, g->models[m].name);
		evbuffer_add_printf(b, "} %d\n", s->up_ok[m] ? 1 : 0);
	}
	for (size_t i = 0; i < N_METRICS; i++) {
		evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", metrics[i].name, metrics[i].help,
				    metrics[i].name, metrics[i].type == M_COUNTER ? "counter" : "gauge");
		for (size_t m = 0; m < g->n_models; m++) {
			if (!s->up_ok[m] || isnan(s->vals[m][i]))
				continue;
			evbuffer_add_printf(b, "%s", metrics[i].name);
			put_label(b, g->models[m].name);
			evbuffer_add_printf(b, "} %.17g\n", s->vals[m][i]);
		}
	}
	put_hist(b, s, 0, "llamad_time_to_first_token_seconds",
		 "Seconds from a Generate's arrival to its first token.");
	put_hist(b, s, 1, "llamad_time_per_token_seconds", "Seconds between a generation's tokens.");
	const struct { const char *name, *help; int type; double v; } own[] = {
		{ "llamad_http_requests_total", "HTTP requests received.", M_COUNTER, (double)g->st.requests },
		{ "llamad_http_client_errors_total", "HTTP requests answered 4xx.", M_COUNTER, (double)g->st.errors_4xx },
		{ "llamad_http_server_errors_total", "HTTP requests answered 5xx.", M_COUNTER, (double)g->st.errors_5xx },
		{ "llamad_http_cancelled_total", "Generations cancelled by the client going away.", M_COUNTER, (double)g->st.cancelled },
		{ "llamad_http_streamed_pieces_total", "Token events passed on.", M_COUNTER, (double)g->st.streamed_tokens },
		{ "llamad_http_conversations_continued_total", "Requests continuing a held session as it was.", M_COUNTER, (double)g->st.conv_exact },
		{ "llamad_http_conversations_forked_total", "Requests continuing a fork of a held session.", M_COUNTER, (double)g->st.conv_forked },
		{ "llamad_http_conversations_new_total", "Requests that opened a new session.", M_COUNTER, (double)g->st.conv_new },
		{ "llamad_http_active_requests", "Generation requests being answered.", M_GAUGE, (double)g->st.active },
		{ "llamad_http_connections", "Callers' connections open.", M_GAUGE, (double)g->st.conns_open },
		{ "llamad_http_connections_refused_total", "Connections refused: their caller held --max-caller-connections.", M_COUNTER, (double)g->st.conns_refused },
		{ "llamad_http_connections_cut_total", "Connections closed: a request not whole by its deadline (--header-timeout).", M_COUNTER, (double)g->st.conns_cut },
		{ "llamad_http_heads_refused_total", "Requests refused for their head: too large (431) or malformed (400).", M_COUNTER, (double)g->st.heads_refused },
		{ "llamad_http_open_streams", "Streamed answers in progress.", M_GAUGE, (double)g->st.streams },
		{ "llamad_http_conversations", "Sessions the gateway indexes.", M_GAUGE, (double)g->conv.count },
	};
	/* every caller's requests: root's and the gateway's own user's to see */
	bool all = s->who.uid == 0 || s->who.uid == g->self_uid;
	for (size_t i = 0; all && i < sizeof(own) / sizeof(own[0]); i++)
		evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", own[i].name, own[i].help,
				    own[i].name, own[i].type == M_COUNTER ? "counter" : "gauge", own[i].name,
				    own[i].v);
	evhttp_add_header(evhttp_request_get_output_headers(s->req), "Content-Type",
			  "text/plain; version=0.0.4; charset=utf-8");
	evhttp_send_reply(s->req, 200, "OK", b);
	evbuffer_free(b);
	free(s->up_ok);
	free(s->vals);
	free(s->hists);
	free(s);
}

static void ask_next(struct mstate *s)
{
	while (s->at < s->g->n_models) {
		int err;
		s->up = http_dial(s->g, &s->g->models[s->at], &s->who, on_status, s, &err);
		if (s->up)
			return;
		s->at++;
	}
	finish(s);
}

void metrics_serve(struct gw *g, struct evhttp_request *req, const struct caller *c)
{
	struct mstate *s = calloc(1, sizeof(*s));
	size_t n = g->n_models ? g->n_models : 1;
	if (s) {
		s->up_ok = calloc(n, sizeof(*s->up_ok));
		s->vals = calloc(n, sizeof(*s->vals));
		s->hists = calloc(n, sizeof(*s->hists));
	}
	if (!s || !s->up_ok || !s->vals || !s->hists) {
		if (s) {
			free(s->up_ok);
			free(s->vals);
			free(s->hists);
		}
		free(s);
		http_send_error(g, req, API_OPENAI_CHAT, 500, "out of memory");
		return;
	}
	s->g = g;
	s->req = req;
	s->who = *c;
	ask_next(s);
}
