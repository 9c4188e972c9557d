/*
 * gateway/limit.c — request bodies over --max-body are refused with a
 * 413 in the API's own error form, before they are read.
 *
 * libevent 2.1's HTTP server checks its body limit itself and answers with
 * an HTML page that no OpenAI or Ollama client parses, and has no hook
 * between a request's head and its body. So each connection's input
 * buffer gets a callback (evbuffer_add_cb on the socket bufferevent that
 * evhttp_set_bevcb lets the gateway make), which runs on every read before
 * evhttp parses the bytes: a Content-Length line over the limit among them
 * (evhttp consumes only whole lines, so a header line is always seen
 * whole) is answered here — the 413 written to the socket at once,
 * Connection: close, the sending side shut — and from then on the
 * connection's input is thrown away until the client closes it or evhttp's
 * timeout does. No state is kept per connection: the callback's argument
 * is the bufferevent, and a refused connection gets another callback.
 * A body sent chunked (no length up front) is still counted by libevent
 * (its own page). A body that itself holds a line "Content-Length: N"
 * with N too large is refused too: only its sender is hurt.
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

#define SCAN_MAX (64 << 10)

static struct gw *G;

/* A refused connection's input: thrown away. */
static void drain(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg)
{
	(void)arg;
	if (info->n_added)
		evbuffer_drain(in, evbuffer_get_length(in));
}

/* The value of the first "Content-Length:" line of p[0..n) whose number is
 * over max, or 0; *api_path: whether a request line in p names /api/. */
static unsigned long long too_long(const char *p, size_t n, size_t max, bool *ollama)
{
	static const char key[] = "content-length:";
	const size_t kl = sizeof(key) - 1;
	for (size_t i = 0; i < n; i++) {
		if (i && p[i - 1] != '\n')
			continue;
		/* a request line: METHOD SP PATH */
		if (!*ollama) {
			const char *sp = memchr(p + i, ' ', n - i < 16 ? n - i : 16);
			if (sp && (size_t)(sp - p) + 6 < n && !strncmp(sp + 1, "/api/", 5))
				*ollama = true;
		}
		if (n - i > kl && !strncasecmp(p + i, key, kl)) {
			const char *v = p + i + kl;
			const char *end = p + n;
			while (v < end && (*v == ' ' || *v == '\t'))
				v++;
			unsigned long long len = 0;
			const char *d = v;
			while (d < end && *d >= '0' && *d <= '9' && len < (1ull << 50))
				len = len * 10 + (unsigned)(*d++ - '0');
			/* only a whole line counts (the rest may come later) */
			if (d > v && d < end && (*d == '\r' || *d == '\n' || *d == ' ') && len > max)
				return len;
		}
	}
	return 0;
}

static void refuse(struct bufferevent *bev, struct evbuffer *in, unsigned long long len, bool ollama)
{
	char msg[160];
	snprintf(msg, sizeof(msg), "the request body (%llu bytes) is over the limit of %zu bytes (--max-body)",
		 len, G->max_body);
	char *body = render_error(ollama ? API_OLLAMA_CHAT : API_OPENAI_CHAT, 413, msg);
	const char *b = body ? body : "{\"error\":\"request body too large\"}";
	char out[512];
	int k = snprintf(out, sizeof(out), "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
			 "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n", strlen(b) + 1, b);
	free(body);
	int fd = bufferevent_getfd(bev);
	/* a few hundred bytes on a fresh connection: the socket takes them */
	if (fd >= 0 && k > 0 && (size_t)k < sizeof(out)) {
		if (send(fd, out, (size_t)k, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
			gw_log(G, GW_DEBUG, "413: %m");
		shutdown(fd, SHUT_WR);
	}
	G->st.requests++;
	G->st.errors_4xx++;
	gw_log(G, GW_DEBUG, "refused a body of %llu bytes (--max-body %zu)", len, G->max_body);
	evbuffer_drain(in, evbuffer_get_length(in));
}

static void watch_input(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg)
{
	if (!info->n_added)
		return;
	struct bufferevent *bev = arg;
	size_t n = evbuffer_get_length(in);
	if (n > SCAN_MAX)
		n = SCAN_MAX;
	const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)n);
	bool ollama = false;
	unsigned long long len = p ? too_long(p, n, G->max_body, &ollama) : 0;
	if (!len)
		return;
	evbuffer_remove_cb(in, watch_input, arg);
	evbuffer_add_cb(in, drain, arg);
	refuse(bev, in, len, ollama);
}

static struct bufferevent *make_bev(struct event_base *base, void *arg)
{
	(void)arg;
	struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (bev)
		evbuffer_add_cb(bufferevent_get_input(bev), watch_input, bev);
	return bev;
}

void limit_setup(struct gw *g)
{
	G = g;
	evhttp_set_bevcb(g->http, make_bev, NULL);
}
