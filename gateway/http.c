/*
 * gateway/http.c — the routes of llamad-http and who is calling.
 * Generation requests go to job.c, /metrics to metrics.c; the rest
 * (models, version, health, running sessions) are answered here, with the
 * replies of reply.c.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "gateway/http_int.h"
#include "util/clock.h"
#include "gateway/conn.h"
#include "gateway/render.h"

/* ---- callers ------------------------------------------------------------- */

/* Who sent req: the connection's peer (conn.c: SO_PEERCRED on the Unix
 * socket, the owner of a loopback TCP peer), or on TCP with --token-file
 * the user its bearer token names (whose share of connections the
 * connection then counts in). 0, or the HTTP status to refuse with (401,
 * 429) and *why. */
static int identify(struct gw *g, struct evhttp_request *req, struct caller *c, const char **why)
{
	*why = "the caller could not be identified";
	int rc = conn_caller(req, c);
	if (rc == 0)
		return 0;
	if (rc != -ENOENT || !g->n_tokens)
		return 500;
	const char *auth = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
	*why = "a bearer token is required (Authorization: Bearer TOKEN)";
	if (!auth || strncasecmp(auth, "Bearer ", 7))
		return 401;
	const char *t = auth + 7;
	while (*t == ' ')
		t++;
	for (size_t i = 0; i < g->n_tokens; i++)
		if (!strcmp(g->tokens[i].token, t)) {
			c->uid = g->tokens[i].uid;
			snprintf(c->who, sizeof(c->who), "token:%s", g->tokens[i].who);
			if (conn_claim(req, c->uid) == -EUSERS) {
				*why = "this caller holds the most connections a caller may "
				       "(--max-caller-connections)";
				return 429;
			}
			return 0;
		}
	*why = "the bearer token is not known";
	return 401;
}

/* ---- the routes ------------------------------------------------------------ */

static void send_models(struct gw *g, struct evhttp_request *req, bool ollama)
{
	json_t *list = json_array();
	for (size_t i = 0; i < g->n_models; i++) {
		const struct gw_model *m = &g->models[i];
		json_t *o;
		if (!ollama) {
			o = json_pack("{s:s,s:s,s:I,s:s}", "id", m->name, "object", "model", "created",
				      (json_int_t)0, "owned_by", "llamad");
		} else {
			char name[256];
			snprintf(name, sizeof(name), "%s%s", m->name, strchr(m->name, ':') ? "" : ":latest");
			o = json_pack("{s:s,s:s,s:s,s:I,s:s,s:{s:s,s:s}}", "name", name, "model", name,
				      "modified_at", "1970-01-01T00:00:00Z", "size", (json_int_t)0, "digest", "",
				      "details", "format", "llamad", "family", "llama");
		}
		json_array_append_new(list, o);
	}
	json_t *top = ollama ? json_pack("{s:o}", "models", list)
			     : json_pack("{s:s,s:o}", "object", "list", "data", list);
	char *s = json_dumps(top, JSON_COMPACT);
	json_decref(top);
	http_send_json(g, req, 200, s ? s : "{}");
	free(s);
}

/* GET /v1/models/NAME: the model's object, or 404 in OpenAI's form. */
static void send_model(struct gw *g, struct evhttp_request *req, const char *name)
{
	char *dec = evhttp_uridecode(name, 0, NULL);
	const char *n = dec ? dec : name;
	struct gw_model *m = gw_find_model(g, n);
	if (!m) {
		http_send_error(g, req, API_OPENAI_CHAT, 404,
				"The model '%s' does not exist here (GET /v1/models lists them)", n);
		free(dec);
		return;
	}
	free(dec);
	json_t *o = json_pack("{s:s,s:s,s:I,s:s}", "id", m->name, "object", "model", "created",
			      (json_int_t)0, "owned_by", "llamad");
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	http_send_json(g, req, 200, s ? s : "{}");
	free(s);
}

/* GET /health ({"status":"ok"}) and GET / (Ollama clients probe it for
 * "Ollama is running"): answered to anyone, token or not. */
static void send_running(struct gw *g, struct evhttp_request *req, bool health)
{
	if (health) {
		http_send_json(g, req, 200, "{\"status\":\"ok\"}");
		return;
	}
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain");
	struct evbuffer *b = evbuffer_new();
	if (b)
		evbuffer_add_printf(b, "llamad-http %s is running\n", GW_VERSION);
	evhttp_send_reply(req, 200, "OK", b);
	if (b)
		evbuffer_free(b);
}

/* /api/ps: the models whose llamad answers now (a connect, no Hello). */
static void send_ps(struct gw *g, struct evhttp_request *req)
{
	json_t *list = json_array();
	for (size_t i = 0; i < g->n_models; i++) {
		const struct gw_model *m = &g->models[i];
		int fd = frame_dial(m->socket);
		if (fd < 0)
			continue;
		close(fd);
		char name[256];
		snprintf(name, sizeof(name), "%s%s", m->name, strchr(m->name, ':') ? "" : ":latest");
		json_array_append_new(list, json_pack("{s:s,s:s,s:I,s:s,s:s,s:I}", "name", name, "model", name,
						      "size", (json_int_t)0, "digest", "", "expires_at",
						      "9999-12-31T23:59:59Z", "size_vram", (json_int_t)0));
	}
	json_t *top = json_pack("{s:o}", "models", list);
	char *s = json_dumps(top, JSON_COMPACT);
	json_decref(top);
	http_send_json(g, req, 200, s ? s : "{}");
	free(s);
}

static void route(struct evhttp_request *req, void *arg)
{
	struct gw *g = arg;
	g->st.requests++;
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	if (!path)
		path = "";
	/* the paths other servers take too: trailing slashes dropped, and
	 * OpenAI's routes without /v1 (as llama-server answers them) */
	char norm[512];
	size_t pl = strlen(path);
	while (pl > 1 && path[pl - 1] == '/')
		pl--;
	if (pl < sizeof(norm) - 4) {
		bool bare = (pl == 17 && !strncmp(path, "/chat/completions", 17)) ||
			    (pl == 12 && !strncmp(path, "/completions", 12)) ||
			    (pl >= 7 && !strncmp(path, "/models", 7) &&
			     (pl == 7 || path[7] == '/'));
		snprintf(norm, sizeof(norm), "%s%.*s", bare ? "/v1" : "", (int)pl, path);
		path = norm;
	}
	bool ollama = !strncmp(path, "/api/", 5);
	enum api_kind ek = ollama ? API_OLLAMA_CHAT : API_OPENAI_CHAT;
	if (g->stopping) {
		http_send_error(g, req, ek, 503, "llamad-http is shutting down");
		return;
	}
	conn_answering(req);
	/* health probes and "is it running" checks send no token */
	if ((cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD) &&
	    (!strcmp(path, "/health") || !strcmp(path, "/"))) {
		send_running(g, req, !strcmp(path, "/health"));
		return;
	}
	struct caller c = { 0 };
	const char *why;
	int st = identify(g, req, &c, &why);
	if (st) {
		if (st == 401)
			evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
		if (st == 429)
			evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
		http_send_error(g, req, ek, st, "%s", why);
		return;
	}
	static const struct {
		const char *path;
		enum evhttp_cmd_type cmd;
		int what;  /* >= 0: an api_kind; < 0: a GET route */
	} routes[] = {
		{ "/v1/chat/completions", EVHTTP_REQ_POST, API_OPENAI_CHAT },
		{ "/v1/completions", EVHTTP_REQ_POST, API_OPENAI_COMPLETE },
		{ "/api/chat", EVHTTP_REQ_POST, API_OLLAMA_CHAT },
		{ "/api/generate", EVHTTP_REQ_POST, API_OLLAMA_GENERATE },
		{ "/v1/models", EVHTTP_REQ_GET, -1 },
		{ "/api/tags", EVHTTP_REQ_GET, -2 },
		{ "/api/version", EVHTTP_REQ_GET, -3 },
		{ "/api/ps", EVHTTP_REQ_GET, -4 },
		{ "/metrics", EVHTTP_REQ_GET, -5 },
		{ "/health", EVHTTP_REQ_GET, -6 },
		{ "/", EVHTTP_REQ_GET, -7 },
	};
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		if (strcmp(path, routes[i].path))
			continue;
		if (cmd != routes[i].cmd && !(cmd == EVHTTP_REQ_HEAD && routes[i].cmd == EVHTTP_REQ_GET)) {
			evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
					  routes[i].cmd == EVHTTP_REQ_GET ? "GET, HEAD" : "POST");
			http_send_error(g, req, ek, 405, "%s takes %s", path,
					routes[i].cmd == EVHTTP_REQ_GET ? "GET" : "POST");
			return;
		}
		switch (routes[i].what) {
		case -1:
			send_models(g, req, false);
			return;
		case -2:
			send_models(g, req, true);
			return;
		case -3:
			http_send_json(g, req, 200, "{\"version\":\"" GW_OLLAMA_API_VERSION
				       "\",\"llamad\":\"" GW_VERSION "\"}");
			return;
		case -4:
			send_ps(g, req);
			return;
		case -5:
			metrics_serve(g, req, &c);
			return;
		case -6:
		case -7:
			send_running(g, req, routes[i].what == -6);
			return;
		default:
			job_start(g, req, (enum api_kind)routes[i].what, &c);
			return;
		}
	}
	if (!strncmp(path, "/v1/models/", 11) && path[11]) {
		if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
			evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
			http_send_error(g, req, ek, 405, "%s takes GET", path);
			return;
		}
		send_model(g, req, path + 11);
		return;
	}
	http_send_error(g, req, ek, 404, "no route %s (the routes: /v1/chat/completions, /v1/completions, "
			"/v1/models, /v1/models/NAME, /api/chat, /api/generate, /api/tags, /api/version, /api/ps, "
			"/metrics, /health)",
			path);
}

void gw_http_setup(struct gw *g)
{
	evhttp_set_gencb(g->http, route, g);
	evhttp_set_allowed_methods(g->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
				   EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS);
	evhttp_set_max_body_size(g->http, (ev_ssize_t)g->max_body);
	evhttp_set_timeout(g->http, g->timeout_s);
	evhttp_set_default_content_type(g->http, "application/json");
	conn_setup(g);
}
