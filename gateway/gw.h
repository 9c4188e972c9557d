/*
 * gateway/gw.h — llamad-http's state: the models it routes to (one llamad
 * each), its listeners, the callers it knows, the conversation index and
 * its counters. main.c fills it from the command line; http.c serves it.
 */
#ifndef LLAMAD_GATEWAY_GW_H
#define LLAMAD_GATEWAY_GW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <event2/event.h>
#include <event2/http.h>

#include "gateway/conv.h"

#define GW_VERSION "0.2.0"
/* The version of Ollama's API reference that the /api routes follow: what
 * /api/version reports, for the clients that gate features on it (llamad's
 * own there as "llamad") */
#define GW_OLLAMA_API_VERSION "0.12.6"
/* The names of the sessions the gateway makes: GW_SESSION_PREFIX UID-RANDOM
 * (X-Llamad-Session may not name one) */
#define GW_SESSION_PREFIX "http-"

struct gw_model {
	char *name;                /* what requests call it ("model") */
	char *socket;              /* its llamad's socket */
	char *desc;                /* HelloReply.model, once one answered */
};

struct gw_token {
	char *token;
	uid_t uid;
	char *who;                 /* the name the file gives (for the log) */
};

/* A caller and model whose sessions the index holds since the start. */
struct gw_known {
	uint32_t uid, model;
};

struct gw_stats {
	uint64_t requests, errors_4xx, errors_5xx, cancelled;
	uint64_t streamed_tokens, conv_exact, conv_forked, conv_new;
	uint32_t active;           /* requests being answered now */
	uint32_t streams;          /* of which streaming */
	uint32_t conns_open;       /* callers' connections (conn.c) */
	uint64_t conns_refused;    /* over --max-caller-connections */
	uint64_t conns_cut;        /* a request not whole by its deadline */
	uint64_t heads_refused;    /* 431, or 400 for a head (conn.c) */
};

struct gw {
	struct event_base *base;
	struct evhttp *http;
	struct gw_model *models;
	size_t n_models;
	struct gw_token *tokens;   /* --token-file: bearer token -> caller */
	size_t n_tokens;
	size_t max_body;           /* bytes of a request body */
	size_t max_header;         /* bytes of a request head */
	int timeout_s;             /* a stalled client, read or write */
	int header_timeout;        /* a request's head whole within, from its first byte */
	uint32_t max_caller_conns; /* connections one caller holds */
	size_t max_convs;          /* sessions kept per caller and model */
	bool log_prompts;
	bool quiet;
	int verbose;
	bool journal;              /* stderr is the journal (JOURNAL_STREAM) */
	uid_t self_uid;
	struct conv_index conv;
	struct gw_known *known;    /* read into the index (job.c) */
	size_t n_known;
	struct gw_stats st;
	bool stopping;
	double started;            /* monotonic seconds */
};

/* Log a line to stderr (journald adds the time). */
void gw_log(struct gw *g, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
enum { GW_ERR = 3, GW_WARN = 4, GW_INFO = 6, GW_DEBUG = 7 };

/* The model a request names (NULL: none). */
struct gw_model *gw_find_model(struct gw *g, const char *name);

/* Register the HTTP routes on g->http. */
void gw_http_setup(struct gw *g);

#endif
