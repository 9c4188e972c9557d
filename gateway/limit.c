/*
 * gateway/limit.c — request bodies over --max-body are refused with a
 * 413 in the API's own error form, before they are read.
 *
 * libevent 2.1's HTTP server checks its body limit itself and answers with
 * an HTML page no OpenAI or Ollama client can parse, with no hook to
 * change it. So every connection's bytes pass through a filter (a
 * bufferevent_filter below evhttp's bufferevent) that reads each request's
 * head as it arrives: a Content-Length over the limit is answered here
 * (413, JSON, Connection: close) and the connection closed once the answer
 * is out; the body is never buffered. Bodies sent chunked (no length up
 * front) are counted by libevent (its own 413 page, the one case left).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>

#include "gateway/gw.h"
#include "gateway/limit.h"
#include "gateway/render.h"

#define HEAD_MAX (64 << 10)

enum lstate { L_HEAD, L_BODY, L_PASS, L_DEAD };

struct lim {
	struct gw *g;
	struct bufferevent *under;
	enum lstate st;
	size_t left;               /* L_BODY: body bytes still to pass */
};

/* Value of header name in head[0..n) (case-insensitive), or NULL. */
static const char *find_header(const char *head, size_t n, const char *name, size_t *vlen)
{
	size_t nl = strlen(name);
	const char *p = memchr(head, '\n', n);
	while (p && (size_t)(p - head) + 1 < n) {
		const char *line = p + 1;
		const char *eol = memchr(line, '\n', n - (size_t)(line - head));
		if (!eol)
			break;
		if ((size_t)(eol - line) > nl && !strncasecmp(line, name, nl) && line[nl] == ':') {
			const char *v = line + nl + 1;
			while (v < eol && (*v == ' ' || *v == '\t'))
				v++;
			const char *e = eol;
			while (e > v && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t'))
				e--;
			*vlen = (size_t)(e - v);
			return v;
		}
		p = eol;
	}
	return NULL;
}

static void drained(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	(void)info;
	struct lim *l = arg;
	if (evbuffer_get_length(buf) == 0)
		shutdown(bufferevent_getfd(l->under), SHUT_RDWR);
}

static void refuse(struct lim *l, const char *head, size_t n, unsigned long long len)
{
	const char *sp = memchr(head, ' ', n);
	bool ollama = sp && (size_t)(sp - head) + 6 < n && !strncmp(sp + 1, "/api/", 5);
	char msg[160];
	snprintf(msg, sizeof(msg), "the request body (%llu bytes) is over the limit of %zu bytes (--max-body)",
		 len, l->g->max_body);
	char *body = render_error(ollama ? API_OLLAMA_CHAT : API_OPENAI_CHAT, 413, msg);
	const char *b = body ? body : "{\"error\":\"request body too large\"}";
	struct evbuffer *out = bufferevent_get_output(l->under);
	evbuffer_add_printf(out, "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
			    "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n", strlen(b) + 1, b);
	free(body);
	l->g->st.errors_4xx++;
	l->g->st.requests++;
	gw_log(l->g, GW_DEBUG, "refused a body of %llu bytes (--max-body %zu)", len, l->g->max_body);
	evbuffer_add_cb(out, drained, l);
	l->st = L_DEAD;
}

static enum bufferevent_filter_result in_filter(struct evbuffer *src, struct evbuffer *dst,
						ev_ssize_t lim, enum bufferevent_flush_mode mode, void *ctx)
{
	(void)lim;
	(void)mode;
	struct lim *l = ctx;
	for (;;) {
		size_t have = evbuffer_get_length(src);
		if (!have)
			return BEV_OK;
		switch (l->st) {
		case L_DEAD:
			evbuffer_drain(src, have);
			return BEV_OK;
		case L_PASS:
			evbuffer_remove_buffer(src, dst, have);
			return BEV_OK;
		case L_BODY: {
			size_t k = have < l->left ? have : l->left;
			evbuffer_remove_buffer(src, dst, k);
			l->left -= k;
			if (!l->left)
				l->st = L_HEAD;
			continue;
		}
		case L_HEAD: {
			struct evbuffer_ptr e = evbuffer_search(src, "\r\n\r\n", 4, NULL);
			if (e.pos < 0) {
				if (have > HEAD_MAX)
					l->st = L_PASS;  /* libevent refuses it */
				else
					return BEV_NEED_MORE;
				continue;
			}
			size_t n = (size_t)e.pos + 4;
			const char *head = (const char *)evbuffer_pullup(src, (ev_ssize_t)n);
			size_t vl;
			const char *te = find_header(head, n, "Transfer-Encoding", &vl);
			const char *cl = find_header(head, n, "Content-Length", &vl);
			unsigned long long len = 0;
			if (cl) {
				char tmp[32];
				size_t k = vl < sizeof(tmp) - 1 ? vl : sizeof(tmp) - 1;
				memcpy(tmp, cl, k);
				tmp[k] = 0;
				len = strtoull(tmp, NULL, 10);
			}
			if (te) {
				/* chunked: libevent counts it */
				evbuffer_remove_buffer(src, dst, n);
				l->st = L_PASS;
				continue;
			}
			if (len > l->g->max_body) {
				refuse(l, head, n, len);
				continue;
			}
			evbuffer_remove_buffer(src, dst, n);
			l->left = (size_t)len;
			l->st = len ? L_BODY : L_HEAD;
			continue;
		}
		}
	}
}

static struct bufferevent *make_bev(struct event_base *base, void *arg)
{
	struct gw *g = arg;
	struct lim *l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->g = g;
	l->under = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!l->under) {
		free(l);
		return NULL;
	}
	struct bufferevent *f = bufferevent_filter_new(l->under, in_filter, NULL, BEV_OPT_CLOSE_ON_FREE,
						       free, l);
	if (!f) {
		bufferevent_free(l->under);
		free(l);
	}
	return f;
}

void limit_setup(struct gw *g)
{
	evhttp_set_bevcb(g->http, make_bev, g);
}
